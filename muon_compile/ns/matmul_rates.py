"""Matmul throughput by device type, dtype and size: the device profile of the cost model.

A :class:`MatmulRates` holds, per dtype, the measured GFLOP/s of a batched product of
``s x s`` matrices for a few sizes ``s``. A product of other dimensions is priced at the
size of the cube of equal volume (``(m k n) ** (1/3)``), interpolated log-log between the
table's sizes and held flat beyond its ends. That is enough for what the table is used
for: comparing two evaluations of one Newton–Schulz iteration whose products differ in
shape and dtype, not predicting wall time to the percent.

Where a profile also measured non-square products, the rate depends on the product's
aspect too (:data:`FAMILIES`): a product whose inner dimension ``k`` is the long one
(the Newton–Schulz's ``X X^T``) or whose output is (its ``B X``). Each such table holds
the rates of products :data:`ASPECT` times longer one way than the others, by the size
of their cube; a product is priced between the square rate and its family's, linearly
in log aspect, the family's held beyond :data:`ASPECT`. On the project's first VM (AVX-512
BF16) the cube rule held to about 10%; on an AMX one some of the iteration's long products
ran at 0.7 of square ones of equal volume (docs/advisor.md). Neither rule sees a size the
library's kernels do not tile well (383 rows there: 0.3).

The rates are those of large batches. A product call also costs a latency that does not
shrink with its work (dispatch, the BLAS library's setup): on the 2-core VM a bf16 ``bmm``
of one or two matrices of 37 to 256 rows costs about 10 us beyond its arithmetic, one of
8 rows about 2 us (another code path). ``latency``, where measured
(``python -m muon_compile.advisor.calibrate`` on a CPU), holds those seconds per call by
size, interpolated linearly in log size and held flat beyond its ends; without it a call
costs its arithmetic alone.

Tables (the compile path's ``auto`` choice reads these; the advisor can read a profile
of the user's own device instead, :mod:`muon_compile.advisor.calibrate`):

* ``cpu``: measured on the project's 2-core VM (torch 2.13.0+cpu, oneDNN/MKL), medians
  of 7 batched products per size; its bf16 products run on AVX-512 BF16.
* ``cpu-avx2``: a CPU without AVX-512 (2026-12-07, a 2-core AMD EPYC VM with AVX2 and FMA,
  torch 2.13.0+cpu): oneDNN takes bf16 products only with AVX-512, so ATen's reference
  kernels form them, at 1-3 GFLOP/s against fp32's 150-175. Its other tables are ``cpu``'s
  (not measured there). :func:`cpu_profile` picks between the two by the CPU's flags
  (``MUON_COMPILE_CPU_RATES`` names one instead).
* ``cuda``: measured on one NVIDIA H100 80GB HBM3 (SXM; torch 2.11.0+cu130, CUDA 13.0) on
  2026-11-26 with the batches and CUDA-event timing that
  :mod:`muon_compile.advisor.calibrate` uses (median of 5 timings), bf16 also in the
  non-square families (whose batches at 32 rows held 4 times as many products, 65,536).
  fp32 is without TF32, PyTorch's default for matmul. Until then this table was an
  estimate from NVIDIA's dense peaks, below the measured bf16 rates up to 256 rows (2
  against 19 TFLOP/s at 64) and above them from 1024.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import torch

AUTO_PROFILE = "auto"
Table = tuple[tuple[float, float], ...]  # (size, GFLOP/s or seconds), sizes ascending

# How many times longer than its other dimensions the long one of a non-square product a
# profile measures is; the families of such products, named by their long dimension:
# ``(s x 4s) @ (4s x s)`` and ``(s x s) @ (s x 4s)``.
ASPECT = 4
LONG_INNER, LONG_OUTER = "long inner", "long outer"
FAMILIES = (LONG_INNER, LONG_OUTER)


def family_product(family: str, s: int) -> tuple[int, int, int]:
    """``(m, k, n)`` of the product of ``family`` with short side ``s``, as profiles time it."""
    return {LONG_INNER: (s, ASPECT * s, s), LONG_OUTER: (s, s, ASPECT * s)}[family]


def _cube_size(m: int, k: int, n: int) -> float:
    """The side of the cube of the product's volume: the size it is priced at."""
    return (m * k * n) ** (1 / 3)


def family_table(family: str, points) -> Table:
    """``family``'s table as :class:`MatmulRates` holds it, ``(cube size, GFLOP/s)``, from
    ``(short side, GFLOP/s)`` points as profiles measure them (:func:`family_product`)."""
    return tuple((_cube_size(*family_product(family, int(s))), float(r)) for s, r in points)


def _aspect(m: int, k: int, n: int) -> tuple[str, float]:
    """The family a product is priced in and how far it is from square: its inner dimension
    against the outer ones' geometric mean, or its longer outer dimension against the
    other two's; the larger of the two (1 for a square product)."""
    inner = k / math.sqrt(m * n)
    outer = max(m, n) / math.sqrt(k * min(m, n))
    return (LONG_INNER, inner) if inner >= outer else (LONG_OUTER, outer)


def interpolate(table: Table, size: float, log_log: bool = False) -> float:
    """``table``'s value at ``size``: linear in log size between its sizes (the value's log
    too with ``log_log``), flat beyond its ends."""
    if size <= table[0][0]:
        return table[0][1]
    for (s0, v0), (s1, v1) in zip(table, table[1:]):
        if size <= s1:
            t = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return math.exp(math.log(v0) + t * (math.log(v1) - math.log(v0))) if log_log else v0 + t * (v1 - v0)
    return table[-1][1]


# the lowering choices a device measures, each a table of MatmulRates (MatmulRates.speedup)
CHOICES = ("symmetric", "epilogue", "orientation")


@dataclasses.dataclass(frozen=True)
class MatmulRates:
    """Measured (or estimated, see ``source``) matmul rates of one device type."""

    device: str
    source: str
    tables: Mapping[torch.dtype, Table]
    latency: Mapping[torch.dtype, Table] = dataclasses.field(default_factory=dict)  # (size, seconds per call)
    # per family of FAMILIES, per dtype: (cube size, GFLOP/s) of its products, where measured
    families: Mapping[str, Mapping[torch.dtype, Table]] = dataclasses.field(default_factory=dict)
    # per dtype: (m, bmm's time / sym_bmm's) of the symmetric products at an m x m Gram matrix, one
    # X Xᵀ (X m x 4m) and one square together (muon_compile.kernels.sym; the table scripts/bench_sym.py
    # prints), where measured: none yet, so never chosen
    symmetric: Mapping[torch.dtype, Table] = dataclasses.field(default_factory=dict)
    # per dtype: (m, the polynomial form's time / the epilogue form's) of the textbook iteration on
    # a stack of m x 4m matrices (muon_compile.ns.cost.choose_epilogue; the table
    # scripts/bench_epilogue.py prints), where measured
    epilogue: Mapping[torch.dtype, Table] = dataclasses.field(default_factory=dict)
    # per dtype: (m, the transposed orientation's time / the native one's) of the textbook iteration
    # on a stack of 4m x m matrices, given and returned tall (muon_compile.ns.cost.choose_orientation;
    # the table scripts/bench_epilogue.py --compare orientation prints), where measured
    orientation: Mapping[torch.dtype, Table] = dataclasses.field(default_factory=dict)

    def rate(self, dtype: torch.dtype, m: int, k: int, n: int) -> float:
        """GFLOP/s of an ``(m x k) @ (k x n)`` product in ``dtype`` (see the module docstring)."""
        table = self.tables.get(dtype)
        if table is None:
            raise ValueError(f"no {self.device} matmul rates for {dtype}; known: {sorted(map(str, self.tables))}")
        size = _cube_size(m, k, n)
        square = interpolate(table, size, log_log=True)
        family, aspect = _aspect(m, k, n)
        long = self.families.get(family, {}).get(dtype)
        if long is None or aspect <= 1:
            return square
        weight = min(1.0, math.log(aspect) / math.log(ASPECT))
        return square ** (1 - weight) * interpolate(long, size, log_log=True) ** weight

    def speedup(self, choice: str, dtype: torch.dtype, m: int) -> float | None:
        """How many times faster the first form of one lowering ``choice`` runs than the other
        at an ``m x m`` Gram matrix in ``dtype``, interpolated in its measured table (the field
        of that name: ``symmetric``, ``epilogue`` or ``orientation``, each described above);
        None where nothing was measured."""
        if choice not in CHOICES:
            raise ValueError(f"no measured lowering choice {choice!r}; known: {', '.join(CHOICES)}")
        table = getattr(self, choice).get(dtype)
        return interpolate(table, m) if table else None

    def product_dtype(self, dtype: torch.dtype, m: int) -> torch.dtype:
        """The dtype the products of an iteration in ``dtype`` at an ``m x m`` Gram matrix are
        formed in: fp32, on ``dtype``'s values, where ``dtype`` is bf16 or fp16 and this device's
        square fp32 rate at ``m`` is the higher (every product of two bf16 or fp16 numbers is
        exact in fp32, and a low-precision product accumulates in fp32 too: the result, rounded
        back to ``dtype``, differs from the low-precision product's only by the order of the sums);
        ``dtype`` itself otherwise."""
        if dtype not in WIDENED or torch.float32 not in self.tables or dtype not in self.tables:
            return dtype
        return torch.float32 if self.rate(torch.float32, m, m, m) > self.rate(dtype, m, m, m) else dtype

    def call_seconds(self, dtype: torch.dtype, m: int, k: int, n: int) -> float:
        """Seconds one batched ``(m x k) @ (k x n)`` product call costs beyond its
        arithmetic, whatever its batch (see the module docstring); 0 without a latency table."""
        table = self.latency.get(dtype)
        return interpolate(table, _cube_size(m, k, n)) if table else 0.0

    def seconds(self, dtype: torch.dtype, m: int, k: int, n: int, count: int = 1) -> float:
        """Predicted seconds of ``count`` ``(m x k) @ (k x n)`` products in ``dtype`` (none
        for an empty product: a rank's empty block of a matrix)."""
        if not m * k * n:
            return 0.0
        return count * 2 * m * k * n / (self.rate(dtype, m, k, n) * 1e9)


# measured on 2026-11-23 on the 2-core VM (AMD EPYC; its bf16 products run on AVX-512 BF16).
_CPU_BF16: Table = ((32, 109.7), (64, 420.2), (128, 499.6), (256, 664.3), (512, 759.1), (1024, 712.2), (2048, 678.0))
_CPU_FP16: Table = ((32, 5.2), (64, 5.7), (128, 5.9), (256, 2.5), (512, 2.2), (1024, 1.0), (2048, 0.3))
_CPU_FP32: Table = ((32, 83.9), (64, 123.2), (128, 169.9), (256, 179.7), (512, 190.3), (1024, 187.6), (2048, 195.0))
_CPU_FP64: Table = ((32, 32.2), (64, 57.6), (128, 63.1), (256, 82.8), (512, 85.2), (1024, 92.0), (2048, 85.1))

# measured on 2026-12-07 on a 2-core AMD EPYC VM with AVX2 and no AVX-512 (torch 2.13.0+cpu, batches
# of 2**24 multiply-adds, 2**27 in fp32 and fp64, median of 5): the cpu-avx2 profile
_CPU_AVX2_BF16: Table = ((32, 2.6), (64, 2.9), (128, 3.0), (256, 1.4), (512, 1.3))
_CPU_AVX2_FP16: Table = ((32, 3.1), (64, 3.1), (128, 3.5), (256, 1.4), (512, 1.3))
_CPU_AVX2_FP32: Table = ((32, 14.0), (64, 44.4), (128, 155.3), (256, 168.8), (512, 175.8), (1024, 88.5), (2048, 100.7))
_CPU_AVX2_FP64: Table = ((32, 6.3), (64, 18.6), (128, 30.8), (256, 34.2), (512, 33.7), (1024, 40.7), (2048, 51.0))

# the textbook iteration's polynomial form against its epilogue form (time ratio by m; both
# compiled, 5 iterations on a stack of m x 4m matrices), measured on 2026-12-02 on the 2-core VM:
# python scripts/bench_epilogue.py --device cpu --sizes 64,128,256,384,512,768,1024,2048 --reps 7
# (a CPU baddbmm copies its input into its output before the product: a pass over X)
_CPU_EPILOGUE: dict[torch.dtype, Table] = {
    torch.bfloat16: ((64, 0.810), (128, 0.957), (256, 0.921), (384, 0.916), (512, 0.942), (768, 0.968), (1024, 0.957), (2048, 0.949)),
    torch.float32: ((64, 0.892), (128, 0.945), (256, 0.914), (384, 0.988), (512, 0.929), (768, 1.038), (1024, 1.027), (2048, 0.919)),
}

# the textbook iteration on tall matrices transposed (wide iterates, the input and the result
# transposed in memory) against kept in their own layout (time ratio by m; both compiled, 5
# iterations on a stack of 4m x m matrices), measured on 2026-12-07 on the 2-core Intel Xeon VM:
# python scripts/bench_epilogue.py --compare orientation --device cpu --sizes 64,128,256,384,512,768,1024 --reps 7
# (a second run: 1.05 at 384, 1.04 at 768, 0.71 at 1024, 0.76 at 1536 in bf16: from m = 1024 the
# tall product X^T X of the native layout is the slower)
_CPU_ORIENTATION: dict[torch.dtype, Table] = {
    torch.bfloat16: ((64, 1.090), (128, 1.171), (256, 1.043), (384, 1.096), (512, 1.032), (768, 1.079), (1024, 0.688)),
    torch.float32: ((64, 0.993), (128, 1.025), (256, 1.046), (384, 1.032), (512, 1.028), (768, 0.967), (1024, 0.962)),
}

# measured on an H100 80GB HBM3, 2026-11-26 (see the module docstring)
_CUDA_BF16: Table = ((32, 19450.0), (64, 62221.9), (128, 115134.2), (256, 214034.9), (512, 365549.9), (1024, 495268.4), (2048, 552525.8), (4096, 764093.1))
_CUDA_FP16: Table = ((32, 19531.1), (64, 62628.3), (128, 115721.6), (256, 209961.2), (512, 364062.5), (1024, 487178.7), (2048, 534022.8), (4096, 736406.4))
_CUDA_FP32: Table = ((32, 12565.6), (64, 23929.0), (128, 31827.8), (256, 42384.5), (512, 44546.2), (1024, 44184.5), (2048, 49864.2))
_CUDA_FP64: Table = ((32, 7499.3), (64, 13816.0), (128, 22123.8), (256, 31536.1), (512, 36144.8), (1024, 43473.7))
# the families by short side, as measured (family_table keys them by cube size)
_CUDA_BF16_FAMILIES: dict[str, Table] = {
    LONG_INNER: ((32, 64414.2), (64, 142167.2), (128, 250757.1), (256, 392736.6), (512, 502845.1), (1024, 553855.8), (2048, 731182.7)),
    LONG_OUTER: ((32, 41399.7), (64, 80850.0), (128, 144268.4), (256, 268301.3), (512, 415534.8), (1024, 509204.1), (2048, 691918.3)),
}

_CPU = MatmulRates(
    "cpu",
    "measured on the 2-core CI VM (AVX-512 BF16), torch 2.13.0+cpu",
    {torch.bfloat16: _CPU_BF16, torch.float16: _CPU_FP16, torch.float32: _CPU_FP32, torch.float64: _CPU_FP64},
    epilogue=_CPU_EPILOGUE,
    orientation=_CPU_ORIENTATION,
)
PROFILES: dict[str, MatmulRates] = {
    "cpu": _CPU,
    "cpu-avx2": dataclasses.replace(
        _CPU,
        source="measured on a 2-core AMD EPYC VM with AVX2, no AVX-512, torch 2.13.0+cpu",
        tables={torch.bfloat16: _CPU_AVX2_BF16, torch.float16: _CPU_AVX2_FP16, torch.float32: _CPU_AVX2_FP32, torch.float64: _CPU_AVX2_FP64},
    ),
    "cuda": MatmulRates(
        "cuda",
        "measured on an H100 80GB HBM3, torch 2.11.0+cu130",
        {torch.bfloat16: _CUDA_BF16, torch.float16: _CUDA_FP16, torch.float32: _CUDA_FP32, torch.float64: _CUDA_FP64},
        families={f: {torch.bfloat16: family_table(f, t)} for f, t in _CUDA_BF16_FAMILIES.items()},
    ),
}


# the CPU profiles, and the dtypes whose products may be formed in fp32 (MatmulRates.product_dtype)
CPU_PROFILES = ("cpu", "cpu-avx2")
WIDENED = (torch.bfloat16, torch.float16)


def detected_cpu_profile() -> str:
    """This machine's CPU profile: ``cpu`` where the CPU has AVX-512 (oneDNN forms bf16
    products there), ``cpu-avx2`` otherwise."""
    return "cpu" if torch.cpu._is_avx512_supported() else "cpu-avx2"


def cpu_profile(setting: str = AUTO_PROFILE) -> str:
    """The CPU profile ``setting`` (``MUON_COMPILE_CPU_RATES``) names: one of :data:`CPU_PROFILES`,
    or for ``auto`` :func:`detected_cpu_profile`."""
    if setting == AUTO_PROFILE:
        return detected_cpu_profile()
    if setting not in CPU_PROFILES:
        raise ValueError(f"MUON_COMPILE_CPU_RATES must be auto or one of {', '.join(CPU_PROFILES)}, got {setting!r}")
    return setting


def profile_for(device_type: str) -> MatmulRates:
    """The rates of ``device_type`` (``"cpu"``, ``"cuda"``); another accelerator is priced as
    ``cuda``; the CPU's are those of the profile ``MUON_COMPILE_CPU_RATES`` names
    (:func:`cpu_profile`, default: this CPU's)."""
    if device_type == "cpu":
        from .. import config  # config imports the cost model, which imports this module

        return PROFILES[cpu_profile(config.current().cpu_rates)]
    return PROFILES.get(device_type, PROFILES["cuda"])

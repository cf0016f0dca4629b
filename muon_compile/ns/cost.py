"""What each Newton–Schulz algorithm computes, what it costs, and which one ``auto`` picks.

For one wide ``m x n`` matrix (``m <= n``; a tall one is taken through its transpose) and
``T`` iterations, the two evaluations of :mod:`muon_compile.ns.evaluate` are these matmuls
(:func:`products`), in FLOPs:

* ``textbook``: per iteration ``A = X X^T``, ``A A``, ``B X``: ``T (4 m^2 n + 2 m^3)``, in
  the compute dtype.
* ``gram``: ``R = X X^T``, per iteration ``R R`` and (after the first) ``Q <- Z Q`` and
  (before the last) ``R <- Z (Z R)``, then ``Q X``; every :data:`RESTART_EVERY` iterations
  a restart (``X <- Q X``, ``R = X X^T``, ``Q`` dropped). With ``s`` restarts that is
  ``4 (s + 1) m^2 n + (8 T - 6 (s + 1)) m^3``, in fp16 for a bf16 or fp16 step (the Gram
  matrix's condition number is the square of ``X``'s: fp16 keeps 3 more bits than bf16
  at the same matmul rate on GPUs), in the compute dtype otherwise.

So for ``T = 5`` (one restart) Gram needs fewer FLOPs once ``n > 1.5 m`` (0.74x at
``n = 3 m``, 0.67x at ``n = 4 m``) and more on square matrices (1.2x).

:func:`choose` resolves ``auto`` per matrix shape, compute dtype and device type, never
per batch size, so an eager call and a compiled bucket of the same matrices evaluate
alike. The policy is ``MUON_COMPILE_NS_ALGORITHM`` (:mod:`muon_compile.config`): ``auto``
prices both algorithms' products with the device's :mod:`muon_compile.ns.matmul_rates` and
takes the cheaper one, among those allowed by the numerics rule:

* Gram is allowed for bf16 and fp16 compute and at most :data:`GRAM_MAX_STEPS`
  iterations only. ``scripts/stress_numerics.py --algorithms`` measures, against the fp64
  textbook iteration of the same coefficients, the error of each evaluation: a bf16 step
  by Gram (in fp16, one restart) stays below 0.75x the textbook bf16 step's error on
  every input class and preset, while an fp32 Gram step's error exceeds the textbook fp32
  error by up to 3.7x, and a bf16 Gram step of 10 iterations by up to 1.6x
  (docs/benchmarks.md has the table).
"""

from __future__ import annotations

import dataclasses

import torch

from ..kernels.sym import DTYPES as SYMMETRIC_DTYPES
from ..modes import Mode
from .args import AUTO, GRAM, TEXTBOOK, check_algorithm
from .matmul_rates import MatmulRates, profile_for

# Compute dtypes and iteration counts for which "auto" may pick Gram (see the module docstring).
GRAM_DTYPES = (torch.bfloat16, torch.float16)
GRAM_MAX_STEPS = 5
# Gram restarts after every this many iterations (one restart in 5 steps: after iteration
# 3 the fp16 error stayed within 0.56x the textbook bf16 error, after iteration 2 within
# 0.89x; docs/benchmarks.md).
RESTART_EVERY = 3


@dataclasses.dataclass(frozen=True)
class Product:
    """``count`` matmuls ``(m x k) @ (k x n)`` in ``dtype``."""

    m: int
    k: int
    n: int
    count: int
    dtype: torch.dtype

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n * self.count


def iteration_dtype(algorithm: str, compute_dtype: torch.dtype) -> torch.dtype:
    """The dtype of ``algorithm``'s products: the compute dtype, but fp16 for a bf16 Gram iteration."""
    if algorithm == GRAM and compute_dtype == torch.bfloat16:
        return torch.float16
    return compute_dtype


def segments(steps: int, restarts: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The lengths of the runs of Gram iterations between restarts: before each iteration of
    ``restarts`` (:attr:`muon_compile.ns.args.NSArgs.restarts`), or every :data:`RESTART_EVERY`
    iterations when it is None. (The costs here assume the latter.)"""
    if restarts is None:
        return tuple(min(RESTART_EVERY, steps - start) for start in range(0, steps, RESTART_EVERY))
    bounds = (0, *restarts, steps)
    return tuple(end - start for start, end in zip(bounds, bounds[1:]))


def products(algorithm: str, rows: int, cols: int, steps: int, compute_dtype: torch.dtype) -> tuple[Product, ...]:
    """The matmuls of one ``rows x cols`` matrix under ``algorithm`` (``textbook`` or ``gram``)."""
    m, n = min(rows, cols), max(rows, cols)
    dtype = iteration_dtype(algorithm, compute_dtype)
    if algorithm == TEXTBOOK:
        return (Product(m, n, m, steps, dtype), Product(m, m, m, steps, dtype), Product(m, m, n, steps, dtype))
    if algorithm == GRAM:
        runs = segments(steps)
        # per run of L: R R each iteration, Z Q after the first, Z (Z R) before the last
        square = sum(4 * length - 3 for length in runs)
        return (Product(m, n, m, len(runs), dtype), Product(m, m, m, square, dtype), Product(m, m, n, len(runs), dtype))
    raise ValueError(f"products of a concrete algorithm ({TEXTBOOK!r} or {GRAM!r}), got {algorithm!r}")


def pointwise_bytes(algorithm: str, rows: int, cols: int, steps: int, compute_dtype: torch.dtype) -> int:
    """Bytes the memory-bound passes of :func:`muon_compile.ns.evaluate.orthogonalize` read
    and write for one ``rows x cols`` matrix under ``algorithm``, its input and output in
    ``compute_dtype`` and wide (as a distributed bucket stacks them): besides the products,

    * ``textbook``: the norm (read ``X``), ``X / norm`` (read ``X``, write it), and per
      iteration ``B = c A A + b A + a I`` (read ``A A`` and ``A``, write ``B``);
    * ``gram``: the norm, ``X / norm`` written in the accumulation dtype, its cast to the
      iteration dtype (a pass of its own), per iteration ``Z`` (as ``B``) and the result's
      rescale and cast (read ``Q X``, write the result)."""
    m, n = min(rows, cols), max(rows, cols)
    c = compute_dtype.itemsize
    acc = torch.promote_types(compute_dtype, torch.float32).itemsize
    it = iteration_dtype(algorithm, compute_dtype).itemsize
    if algorithm == TEXTBOOK:
        return m * n * 3 * c + steps * 3 * m * m * c
    if algorithm == GRAM:
        return m * n * (2 * c + acc + acc + it + it + c) + steps * 3 * m * m * it
    raise ValueError(f"pointwise bytes of a concrete algorithm ({TEXTBOOK!r} or {GRAM!r}), got {algorithm!r}")


def ns_flops(rows: int, cols: int, steps: int, algorithm: str = TEXTBOOK) -> int:
    """Matmul FLOPs of ``steps`` iterations on one ``rows x cols`` matrix (see the module docstring)."""
    return sum(p.flops for p in products(algorithm, rows, cols, steps, torch.float32))


def predicted_seconds(algorithm: str, rows: int, cols: int, steps: int, compute_dtype: torch.dtype, rates: MatmulRates) -> float:
    """Predicted matmul seconds of one matrix under ``algorithm`` on the device of ``rates``."""
    return sum(rates.seconds(p.dtype, p.m, p.k, p.n, p.count) for p in products(algorithm, rows, cols, steps, compute_dtype))


def call_latency(algorithm: str, rows: int, cols: int, steps: int, compute_dtype: torch.dtype, rates: MatmulRates) -> float:
    """Seconds one batched call on ``rows x cols`` matrices spends in its product calls'
    latency (:meth:`~muon_compile.ns.matmul_rates.MatmulRates.call_seconds`), whatever its batch."""
    return sum(p.count * rates.call_seconds(p.dtype, p.m, p.k, p.n) for p in products(algorithm, rows, cols, steps, compute_dtype))


@dataclasses.dataclass(frozen=True)
class Choice:
    """The algorithm for one matrix shape and why; ``flops`` and ``seconds`` per concrete algorithm."""

    algorithm: str
    reason: str
    flops: dict[str, int]
    seconds: dict[str, float]


# How an evaluation forms its products: torch.bmm / baddbmm in the iteration's dtype, the symmetric
# ones by muon_compile.kernels.sym, or every product in fp32 on the iteration dtype's values, rounded
# back (where the device forms low-precision products slowly: MatmulRates.product_dtype)
BMM, SYMMETRIC, WIDE = "bmm", "sym", "fp32"


class Policy(Mode):
    """A lowering choice's setting (``MUON_COMPILE_SYM_PRODUCTS``, ``MUON_COMPILE_NS_EPILOGUE``,
    ``MUON_COMPILE_NS_ORIENTATION``):
    ``auto`` by the device's measured table, or forced ``on`` / ``off``."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


PRODUCT_POLICIES = tuple(Policy.values())


@dataclasses.dataclass(frozen=True)
class ProductChoice:
    """How an NS evaluation forms its products, and why: its symmetric ones (``X Xᵀ`` and
    squares of Gram matrices) by ``bmm`` or ``sym`` (:mod:`muon_compile.kernels.sym`,
    :func:`choose_products`); the textbook polynomial's scalars in the products'
    ``epilogue`` or in a ``polynomial`` kernel (:func:`choose_epilogue`)."""

    kind: str
    reason: str


# Where the textbook iteration applies its polynomial's scalars (ns.evaluate.orthogonalize):
# in the products' epilogues (B = baddbmm(A, A, A, beta=b, alpha=c); X = baddbmm(X, B, X, beta=a):
# three product calls, no other kernel), or in one fused pointwise kernel on the m x m matrices
# (B = c A A + b A + a I; X = B X: three plain products and that kernel).
EPILOGUE, POLYNOMIAL = "epilogue", "polynomial"

# How the textbook iteration lays out a tall matrix's iterates (ns.evaluate.orthogonalize): as
# its transpose, wide (the input transposed in, the result transposed back), or in the input's
# own tall layout (each new iterate P X written as (X^T P^T)^T: no transposition in memory).
TRANSPOSED, NATIVE = "transposed", "native"


def choose_products(rows: int, cols: int, algorithm: str, compute_dtype: torch.dtype, device_type: str, policy: str = AUTO) -> ProductChoice:
    """``sym`` where ``policy`` (``MUON_COMPILE_SYM_PRODUCTS``) is ``on``; else :data:`WIDE`
    where the device's measured rates form the products' dtype (bf16, fp16) slower than fp32
    at the Gram matrix's size (:meth:`~muon_compile.ns.matmul_rates.MatmulRates.product_dtype`:
    fp16 on every CPU measured, bf16 on one without AVX-512); else ``sym`` where ``policy``
    is ``auto`` and the device's measured table (``MatmulRates.symmetric``) has the
    symmetric kernel faster at that size in the products' dtype; ``bmm``
    otherwise, and always for a dtype the kernel does not take."""
    Policy.check(policy, "MUON_COMPILE_SYM_PRODUCTS")
    dtype = iteration_dtype(algorithm, compute_dtype)
    m = min(rows, cols)
    rates = profile_for(device_type)
    if policy != Policy.ON and rates.product_dtype(dtype, m) != dtype:
        fast, slow = (rates.rate(d, m, m, m) for d in (torch.float32, dtype))
        return ProductChoice(WIDE, f"measured fp32 products {fast:.3g} GFLOP/s against {slow:.3g} in {dtype} at {m}")
    if policy == Policy.OFF:
        return ProductChoice(BMM, "MUON_COMPILE_SYM_PRODUCTS=off")
    if dtype not in SYMMETRIC_DTYPES:
        return ProductChoice(BMM, f"the symmetric kernel takes bf16 / fp16, not {dtype}")
    if policy == Policy.ON:
        return ProductChoice(SYMMETRIC, "MUON_COMPILE_SYM_PRODUCTS=on")
    speedup = rates.speedup("symmetric", dtype, m)
    unmeasured = ProductChoice(BMM, f"no measured rate of symmetric products on {device_type}")
    return _by_table(speedup, m, (SYMMETRIC, BMM), "bmm/symmetric", unmeasured)


def choose_epilogue(rows: int, cols: int, compute_dtype: torch.dtype, device_type: str, policy: str = AUTO) -> ProductChoice:
    """Where the textbook iteration on ``rows x cols`` matrices applies its polynomial's
    scalars (:data:`EPILOGUE` or :data:`POLYNOMIAL`): as ``policy``
    (``MUON_COMPILE_NS_EPILOGUE``) says when it is ``on`` or ``off``; for ``auto``, the form
    the device's measured table (``MatmulRates.epilogue``) has faster at the
    Gram matrix's size in ``compute_dtype``, and the epilogue where nothing was measured
    (the form that device has run until it is measured)."""
    Policy.check(policy, "MUON_COMPILE_NS_EPILOGUE")
    if policy != AUTO:
        return ProductChoice(EPILOGUE if policy == Policy.ON else POLYNOMIAL, f"MUON_COMPILE_NS_EPILOGUE={policy}")
    m = min(rows, cols)
    speedup = profile_for(device_type).speedup("epilogue", compute_dtype, m)
    unmeasured = ProductChoice(EPILOGUE, f"no measured epilogue table on {device_type} for {compute_dtype}")
    return _by_table(speedup, m, (EPILOGUE, POLYNOMIAL), "polynomial/epilogue", unmeasured)


def _by_table(speedup: float | None, m: int, kinds: tuple[str, str], ratio: str, unmeasured: ProductChoice) -> ProductChoice:
    """The first of ``kinds`` where a device's measured ``speedup`` (the second's time over the
    first's, named ``ratio``) at ``m`` is above 1, else the second; ``unmeasured`` without a table."""
    if speedup is None:
        return unmeasured
    return ProductChoice(kinds[0] if speedup > 1.0 else kinds[1], f"measured {ratio} time {speedup:.2f} at {m}")


def choose_orientation(rows: int, cols: int, compute_dtype: torch.dtype, device_type: str, policy: str = AUTO) -> ProductChoice:
    """How the textbook iteration on tall ``rows x cols`` matrices lays out its iterates
    (:data:`NATIVE` or :data:`TRANSPOSED`): as ``policy`` (``MUON_COMPILE_NS_ORIENTATION``)
    says when it is ``on`` (native) or ``off``; for ``auto``, the layout the device's measured
    table (``MatmulRates.orientation``) has faster at the Gram matrix's size in
    ``compute_dtype``, transposed where nothing was measured (the layout that device has run
    until it is measured). A wide matrix has one layout: :data:`TRANSPOSED` names it too."""
    Policy.check(policy, "MUON_COMPILE_NS_ORIENTATION")
    if rows <= cols:
        return ProductChoice(TRANSPOSED, "a wide matrix")
    if policy != AUTO:
        return ProductChoice(NATIVE if policy == Policy.ON else TRANSPOSED, f"MUON_COMPILE_NS_ORIENTATION={policy}")
    m = cols
    speedup = profile_for(device_type).speedup("orientation", compute_dtype, m)
    unmeasured = ProductChoice(TRANSPOSED, f"no measured orientation table on {device_type} for {compute_dtype}")
    return _by_table(speedup, m, (NATIVE, TRANSPOSED), "transposed/native", unmeasured)


def choose(
    rows: int, cols: int, steps: int, compute_dtype: torch.dtype, device_type: str, requested: str = AUTO, policy: str = AUTO
) -> Choice:
    """The algorithm for ``rows x cols`` matrices: ``requested`` unless it is ``auto``, then
    ``policy`` unless it is ``auto``, then the cheaper allowed one (module docstring)."""
    check_algorithm(requested)
    check_algorithm(policy, "MUON_COMPILE_NS_ALGORITHM")
    rates = profile_for(device_type)
    algorithms = (TEXTBOOK, GRAM)
    flops = {a: ns_flops(rows, cols, steps, a) for a in algorithms}
    seconds = {a: predicted_seconds(a, rows, cols, steps, compute_dtype, rates) for a in algorithms}
    if requested != AUTO:
        return Choice(requested, "requested by the call", flops, seconds)
    if policy != AUTO:
        return Choice(policy, f"MUON_COMPILE_NS_ALGORITHM={policy}", flops, seconds)
    if compute_dtype not in GRAM_DTYPES:
        return Choice(TEXTBOOK, f"Gram is not accurate enough in {compute_dtype}", flops, seconds)
    if steps > GRAM_MAX_STEPS:
        return Choice(TEXTBOOK, f"Gram is measured accurate enough up to {GRAM_MAX_STEPS} steps only", flops, seconds)
    if not rows * cols:
        return Choice(TEXTBOOK, "an empty matrix", flops, seconds)
    best = min(algorithms, key=lambda a: (seconds[a], a != TEXTBOOK))
    ratio = seconds[GRAM] / seconds[TEXTBOOK]
    return Choice(best, f"predicted Gram/textbook time {ratio:.2f} on {rates.device}", flops, seconds)

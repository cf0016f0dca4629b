"""Measure this machine's matmul rates for muon_compile.matmul_rates (the cost model's device profile).

    python scripts/measure_matmul_rates.py [--device cpu|cuda] [--reps 7]

For each dtype (bf16, fp16, fp32, fp64) and size ``s`` of the device's table, a batch of
``s x s`` products (:func:`matmul_batch`: as many as make :data:`BATCH_MACS` multiply-adds,
at most :data:`MAX_BATCH`) is timed ``--reps`` times after warm-up; the median gives GFLOP/s.
The batches are sized per device type: on a GPU one product of 512 rows takes less time
than Python takes to launch it (about 20 us), and a table of such calls measures the
launch, not the GPU (the first H100 profile did: 19 TFLOP/s at 512 rows, against 366 with
these batches). On CUDA a timing is a pair of CUDA events around three calls; on the CPU,
the wall time of one. It prints one ``Table`` literal per dtype, in the form
``muon_compile/matmul_rates.py`` holds, and for bf16 the tables of the non-square
families (``muon_compile.matmul_rates.FAMILIES``).
"""

import argparse
import statistics
import time

import torch

from muon_compile.matmul_rates import ASPECT, FAMILIES, LONG_INNER, family_product

DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
_HALF, _FP32, _FP64 = (32, 64, 128, 256, 512, 1024, 2048, 4096), (32, 64, 128, 256, 512, 1024, 2048), (32, 64, 128, 256, 512, 1024)
# per device type: the sizes of each dtype's table (on CUDA fp32 and fp64 stop earlier: a
# 4096 fp32 product takes seconds there), the multiply-adds one timed batch holds, and its
# most matrices. The CPU's: about 0.3 ms of bf16 products on the 2-core VM. CUDA's: about
# 30 us of an H100's bf16 products at the largest sizes, far more below (fewer for fp32 and
# fp64, whose products run 10-20x slower), so the launch does not count.
SIZES = {"cpu": dict.fromkeys(DTYPES, _FP32), "cuda": {torch.bfloat16: _HALF, torch.float16: _HALF, torch.float32: _FP32, torch.float64: _FP64}}
BATCH_MACS = {"cpu": dict.fromkeys(DTYPES, 2**27), "cuda": {torch.bfloat16: 2**33, torch.float16: 2**33, torch.float32: 2**31, torch.float64: 2**29}}
MAX_BATCH = {"cpu": 64, "cuda": 65536}


def seconds(fn, device: str | torch.device, reps: int) -> float:
    """Median seconds per call of ``fn`` (see the module docstring)."""
    if torch.device(device).type == "cuda":
        return _cuda_seconds(fn, reps)
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _cuda_seconds(fn, reps: int, calls: int = 3) -> float:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def device_kind(device: str | torch.device) -> str:
    """The key of :data:`SIZES`, :data:`BATCH_MACS` and :data:`MAX_BATCH` for ``device``:
    ``"cpu"``, else ``"cuda"`` (another accelerator is batched as a GPU)."""
    kind = torch.device(device).type
    return kind if kind in MAX_BATCH else "cuda"


def matmul_batch(size: int, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16) -> int:
    """How many ``size x size`` products one timed batch holds on ``device``:
    :data:`BATCH_MACS` multiply-adds in all, at most :data:`MAX_BATCH`, at least one."""
    kind = device_kind(device)
    return max(1, min(MAX_BATCH[kind], BATCH_MACS[kind][dtype] // size**3))


def family_call(family: str, size: int, device: str | torch.device) -> tuple:
    """``(call, flops)``: one timed batch of bf16 products of ``family`` with short side
    ``size`` (about as many multiply-adds as the square table's batch), written as the
    Newton–Schulz iteration writes them: the long inner dimension as ``bmm(x, x.mT)`` (its
    ``X X^T``), the long output as ``bmm(b, x)`` (its ``B X``)."""
    m, k, n = family_product(family, size)
    batch = max(1, matmul_batch(size, device) // ASPECT)
    x = torch.randn(batch, m, k, device=device).to(torch.bfloat16)
    y = x.mT if family == LONG_INNER else torch.randn(batch, k, n, device=device).to(torch.bfloat16)
    return (lambda: torch.bmm(x, y)), 2 * batch * m * k * n


def rate(dtype: torch.dtype, size: int, device: str, reps: int) -> float:
    batch = matmul_batch(size, device, dtype)
    a = torch.randn(batch, size, size, device=device).to(dtype)
    b = torch.randn(batch, size, size, device=device).to(dtype)
    return 2 * batch * size**3 / seconds(lambda: torch.bmm(a, b), device, reps) / 1e9


def family_rate(family: str, size: int, device: str, reps: int) -> float:
    """bf16 GFLOP/s of ``family``'s products with short side ``size`` (:func:`family_call`)."""
    call, flops = family_call(family, size, device)
    return flops / seconds(call, device, reps) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    print(f"# torch {torch.__version__}, {args.device}, GFLOP/s of batched s x s products (median of {args.reps})")
    kind = device_kind(args.device)
    for dtype in DTYPES:
        entries = ", ".join(f"({s}, {rate(dtype, s, args.device, args.reps):.1f})" for s in SIZES[kind][dtype])
        print(f"{str(dtype)[6:]}: ({entries})", flush=True)
    for family in FAMILIES:
        sizes = SIZES[kind][torch.bfloat16][:-1]
        entries = ", ".join(f"({s}, {family_rate(family, s, args.device, args.reps):.1f})" for s in sizes)
        print(f"bfloat16 {family}: ({entries})", flush=True)


if __name__ == "__main__":
    main()

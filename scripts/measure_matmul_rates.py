"""Measure this machine's matmul rates for muon_compile.matmul_rates (the cost model's device profile).

    python scripts/measure_matmul_rates.py [--device cpu|cuda] [--reps 7]

For each dtype (bf16, fp16, fp32, fp64) and size ``s`` of the table, a batch of ``s x s``
products (as many as make about 2**27 multiply-adds, at most 64) runs ``--reps`` times
after one warm-up; the median gives GFLOP/s. It prints one ``Table`` literal per dtype,
in the form ``muon_compile/matmul_rates.py`` holds.
"""

import argparse
import statistics
import time

import torch

SIZES = (32, 64, 128, 256, 512, 1024, 2048)
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def seconds(fn, device: str, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_batch(size: int) -> int:
    """How many ``size x size`` products one timed batch holds (about 2**27 multiply-adds, at most 64)."""
    return max(1, min(64, 2**27 // size**3))


def rate(dtype: torch.dtype, size: int, device: str, reps: int) -> float:
    batch = matmul_batch(size)
    a = torch.randn(batch, size, size, device=device).to(dtype)
    b = torch.randn(batch, size, size, device=device).to(dtype)
    return 2 * batch * size**3 / seconds(lambda: torch.bmm(a, b), device, reps) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    print(f"# torch {torch.__version__}, {args.device}, GFLOP/s of batched s x s products (median of {args.reps})")
    for dtype in DTYPES:
        entries = ", ".join(f"({s}, {rate(dtype, s, args.device, args.reps):.1f})" for s in SIZES)
        print(f"{str(dtype)[6:]}: ({entries})", flush=True)


if __name__ == "__main__":
    main()

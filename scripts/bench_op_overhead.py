"""Eager cost of the Newton–Schulz op's Python layer: one eager ``muon_compile.Muon`` step
on the many-small workload (96 matrices) and one ``muon_compile.newton_schulz`` call on a
tiny 8x8 matrix, where the arithmetic is negligible and the call overhead dominates.

    python scripts/bench_op_overhead.py [--reps 15] [--calls 2000]

To compare two checkouts, run it alternately with ``PYTHONPATH=<checkout>`` set to each.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import muon_compile

MANY_SMALL = [(64, 192), (192, 64), (96, 96), (128, 256), (256, 128), (64, 64), (128, 384), (384, 128)] * 12


def eager_step_ms(reps: int) -> list[float]:
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in MANY_SMALL]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    opt = muon_compile.Muon(params)
    for _ in range(3):
        opt.step()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        opt.step()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def tiny_call_us(calls: int) -> float:
    x = torch.randn(8, 8)
    for _ in range(100):
        muon_compile.newton_schulz(x, steps=1, compute_dtype=torch.float32)
    start = time.perf_counter()
    for _ in range(calls):
        muon_compile.newton_schulz(x, steps=1, compute_dtype=torch.float32)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    times = eager_step_ms(args.reps)
    print(
        f"{muon_compile.__file__}: eager many-small step median {statistics.median(times):.1f} ms "
        f"(min {min(times):.1f}); tiny newton_schulz call {tiny_call_us(args.calls):.1f} us"
    )


if __name__ == "__main__":
    main()

"""Measure the cost model's profiles of this machine: collective latency and bandwidth over
the process group's backend, and the memory bandwidth of pointwise work.

    torchrun --nproc-per-node 2 scripts/measure_network.py [--backend gloo] [--reps 9]

For each collective kind of muon_compile.network_profiles, times it on inputs of 4 KiB to
16 MiB per rank (bf16; fp32 for the reductions) (median of ``--reps`` after a barrier, the slowest rank's) and
fits the profile's own formula, ``seconds = steps * latency + factor * bytes / bandwidth``,
by least squares on the relative error, printing the fitted link and the fit's worst
relative error (a large one says the alpha-beta model does not describe that backend). Then, on
one rank, the memory bandwidth of ``y.copy_(x)`` on 64 MiB fp32 tensors (read + write
counted). Paste the figures into ``network_profiles.PROFILES`` / ``step_cost.DEVICES``
with the date and the machine.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torch.distributed as dist

from bench_distributed import slowest

SIZES = [2**k for k in range(12, 26, 2)]  # bytes per rank


def timed(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(slowest(time.perf_counter() - start))
    return statistics.median(times)


def collective(kind: str, nbytes: int, world: int):
    x = torch.zeros(nbytes // 2, dtype=torch.bfloat16)
    if kind == "all_gather_into_tensor":
        out = torch.empty(world * x.numel(), dtype=x.dtype)
        return lambda: dist.all_gather_into_tensor(out, x)
    if kind == "all_to_all_single":
        x = torch.zeros(world * (x.numel() // world), dtype=x.dtype)
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x)
    if kind == "reduce_scatter_tensor":
        x = torch.zeros(world * (nbytes // 4 // world), dtype=torch.float32)
        out = torch.empty(x.numel() // world, dtype=x.dtype)
        return lambda: dist.reduce_scatter_tensor(out, x)
    x = torch.zeros(nbytes // 4, dtype=torch.float32)
    return lambda: dist.all_reduce(x)


def coefficients(kind: str, world: int) -> tuple[float, float]:
    """``(steps, factor)`` of ``kind`` in the model of muon_compile.network_profiles."""
    w = world
    if kind == "all_gather_into_tensor":
        return w - 1, w - 1
    if kind == "all_reduce":
        return 2 * (w - 1), 2 * (w - 1) / w
    return w - 1, (w - 1) / w


def fit(points: list[tuple[int, float]], steps: float, factor: float) -> tuple[float, float, float]:
    """Fit ``t = steps * latency + factor * b / bandwidth`` minimising the squared *relative*
    error (small messages count as much as large ones): latency, bandwidth, worst error."""
    rows = [(steps / t, factor * b / t) for b, t in points]  # each row times (latency, 1/bandwidth) ~ 1
    saa = sum(a * a for a, _ in rows)
    sab = sum(a * c for a, c in rows)
    scc = sum(c * c for _, c in rows)
    sa, sc = sum(a for a, _ in rows), sum(c for _, c in rows)
    det = saa * scc - sab * sab
    latency, inverse = (sa * scc - sc * sab) / det, (saa * sc - sab * sa) / det
    if latency < 0:  # no latency term fits: bandwidth alone
        latency, inverse = 0.0, sc / scc
    worst = max(abs(steps * latency + factor * b * inverse - t) / t for b, t in points)
    return latency, 1 / inverse, worst


def memory_bandwidth(reps: int) -> float:
    x = torch.ones(16 * 2**20)
    y = torch.empty_like(x)
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        y.copy_(x)
        times.append(time.perf_counter() - start)
    return 2 * x.numel() * x.element_size() / statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    world, rank = dist.get_world_size(), dist.get_rank()
    if rank == 0:
        print(f"# {args.backend}, world {world}, torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads")
    for kind in ("all_to_all_single", "all_gather_into_tensor", "all_reduce", "reduce_scatter_tensor"):
        points = [(b, timed(collective(kind, b, world), args.reps)) for b in SIZES]
        latency, bandwidth, worst = fit(points, *coefficients(kind, world))
        if rank == 0:
            shown = ", ".join(f"{b // 1024} KiB {t * 1e3:.3f} ms" for b, t in points)
            print(f"{kind}: latency {latency * 1e6:.1f} us, bandwidth {bandwidth / 1e9:.3f} GB/s, worst fit error {worst:.0%}")
            print(f"    {shown}")
    if rank == 0:
        print(f"memory bandwidth (copy, read + write): {memory_bandwidth(args.reps) / 1e9:.2f} GB/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

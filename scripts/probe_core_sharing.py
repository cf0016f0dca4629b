"""Whether a rank that waits in a gloo collective gives its core to the ranks that compute.

    torchrun --standalone --nproc-per-node 3 scripts/probe_core_sharing.py [--seconds 2] [--stretches 20]

A question about the host, not the package: the cost model prices a CPU rank's work at
rates timed with every rank busy at once (scripts/measure_profiles.py). Each phase here
times bf16 products of size 512 for ``--seconds`` on some ranks while the others wait in
an all_reduce, and prints each rank's GFLOP/s and the CPU seconds it used. A waiting rank
that sleeps uses almost none, and the busy ranks then run at one core's rate if the host
has a core for each (docs/benchmarks.md, "Ties, and where the world-3 bias is not").

Then every rank does the same products (as many as about ``--seconds`` took with every
rank busy) three ways, as an all_gather step's buckets do their Newton–Schulz work: in
one stretch; in ``--stretches`` stretches, each followed by an all_gather of
:data:`GATHER_BYTES` per rank (waited at once); and in as many stretches, each
all_gather issued before its stretch and waited after it (prefetched). It prints the
slowest rank's wall time of each, the ranks' seconds waiting in the all_gathers, and
the all_gathers' time alone. Where the ranks have a core each, the cut costs about the
all_gathers; where they share fewer cores, the ranks that finish a stretch first wait for
the last one, and their cores go to it (docs/benchmarks.md, "The all_gather arm").
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

SIZE = 512
GATHER_BYTES = 2**20  # per rank: about a 4 MiB bucket's shard at world 3


def operands() -> tuple[torch.Tensor, torch.Tensor]:
    """Two bf16 ``SIZE x SIZE`` matrices to multiply."""
    return torch.randn(SIZE, SIZE).bfloat16(), torch.randn(SIZE, SIZE).bfloat16()


def gflops(seconds: float) -> float:
    """bf16 ``SIZE`` products back to back for ``seconds``: their GFLOP/s."""
    a, b = operands()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return count * 2 * SIZE**3 / (time.perf_counter() - start) / 1e9


def stretches(count: int, cuts: int, gather: str) -> tuple[float, float]:
    """``count`` bf16 ``SIZE`` products in ``cuts`` stretches, started after a barrier,
    each stretch with an all_gather: ``"none"``, ``"after"`` (waited at once) or
    ``"prefetched"`` (issued before the stretch, waited after it). This rank's wall
    seconds and its seconds waiting in the all_gathers."""
    a, b = operands()
    world = dist.get_world_size()
    x = torch.ones(GATHER_BYTES // 2, dtype=torch.bfloat16)
    out = torch.empty(world * x.numel(), dtype=x.dtype)
    bounds = [count * i // cuts for i in range(cuts + 1)]
    waited = 0.0
    dist.barrier()
    start = time.perf_counter()
    for lo, hi in zip(bounds, bounds[1:]):
        work = dist.all_gather_into_tensor(out, x, async_op=True) if gather == "prefetched" else None
        for _ in range(hi - lo):
            a @ b
        if gather == "none":
            continue  # nothing to wait for: waited stays 0
        wait = time.perf_counter()
        if gather == "after":
            dist.all_gather_into_tensor(out, x)
        else:
            work.wait()
        waited += time.perf_counter() - wait
    return time.perf_counter() - start, waited


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--stretches", type=int, default=20, help="stretches the products are cut into")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.stretches < 1:
        parser.error(f"--stretches {args.stretches}: at least 1")
    flag = torch.zeros(1)
    all_busy = 0.0
    for busy in range(world, 0, -1):  # all ranks busy, then one fewer each phase
        dist.barrier()
        cpu = time.process_time()
        rate = gflops(args.seconds) if rank < busy else None
        dist.all_reduce(flag)
        figures = [None] * world
        dist.all_gather_object(figures, (rate, time.process_time() - cpu))
        if busy == world:
            all_busy = min(g for g, _ in figures)
        if rank == 0:
            print(f"{busy} of {world} ranks busy: " + " | ".join(
                f"rank {r}: {f'{g:.1f} GFLOP/s' if g else 'waiting'}, {c:.2f} CPU s" for r, (g, c) in enumerate(figures)))
    count = max(args.stretches, round(all_busy * 1e9 * args.seconds / (2 * SIZE**3)))
    cuts = {"none": 1, "after": args.stretches, "prefetched": args.stretches}
    runs = {gather: stretches(count, n, gather) for gather, n in cuts.items()}
    alone = stretches(0, args.stretches, "after")[0]  # the all_gathers, no products
    figures = [None] * world
    dist.all_gather_object(figures, runs)
    if rank == 0:
        uncut = max(f["none"][0] for f in figures)
        print(f"{count} products per rank, every rank busy, {args.stretches} all_gathers of {GATHER_BYTES // 1024} KiB "
              f"per rank alone: {alone:.3f} s")
        for gather, label in (("none", "one stretch"), ("after", "all_gather after each stretch"),
                              ("prefetched", "all_gather prefetched")):
            wall = max(f[gather][0] for f in figures)
            waits = ", ".join(f"{f[gather][1]:.3f}" for f in figures)
            print(f"  {label}: {wall:.3f} s ({(wall / uncut - 1) * 100:+.1f}%), waiting {waits} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Whether a rank that waits in a gloo collective gives its core to the ranks that compute.

    torchrun --standalone --nproc-per-node 3 scripts/probe_core_sharing.py [--seconds 2]

A question about the host, not the package: the cost model prices a CPU rank's work at
rates timed with every rank busy at once (scripts/measure_profiles.py). Each phase here
times bf16 products of size 512 for ``--seconds`` on some ranks while the others wait in
an all_reduce, and prints each rank's GFLOP/s and the CPU seconds it used. A waiting rank
that sleeps uses almost none, and the busy ranks then run at one core's rate if the host
has a core for each (docs/benchmarks.md, "Ties, and where the world-3 bias is not").
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

SIZE = 512


def gflops(seconds: float) -> float:
    """bf16 ``SIZE`` products back to back for ``seconds``: their GFLOP/s."""
    a, b = torch.randn(SIZE, SIZE).bfloat16(), torch.randn(SIZE, SIZE).bfloat16()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return count * 2 * SIZE**3 / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    flag = torch.zeros(1)
    for busy in range(world, 0, -1):  # all ranks busy, then one fewer each phase
        dist.barrier()
        cpu = time.process_time()
        rate = gflops(args.seconds) if rank < busy else None
        dist.all_reduce(flag)
        figures = [None] * world
        dist.all_gather_object(figures, (rate, time.process_time() - cpu))
        if rank == 0:
            print(f"{busy} of {world} ranks busy: " + " | ".join(
                f"rank {r}: {f'{g:.1f} GFLOP/s' if g else 'waiting'}, {c:.2f} CPU s" for r, (g, c) in enumerate(figures)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""What a collective costs when it follows a stretch of compute, as in a step, against back to back.

    torchrun --standalone --nproc-per-node W scripts/probe_collective_after_compute.py
        [--sizes 4,64,1024] [--gaps 0,0.3,1,3] [--reps 5] [--realtime-gloo]

A question about the host, not the package: the network profile times each collective
back to back (scripts/measure_profiles.py's sweep), while in a step every collective but
the prefetched launches comes after the Newton–Schulz work of a bucket. For each
collective kind of the step (the functional op and its wait, as
:func:`measure_profiles.collective` calls it), each size in KiB per rank and each gap in
ms, every rank times, after a barrier: the collective alone, back to back; bf16 products
lasting about the gap alone; and the products each followed by the collective. The
collective's cost after compute is the last less the products, per call; each figure is
the median of ``--reps`` timings of the slowest rank (docs/benchmarks.md, "A collective
after compute"). The validation measures the same at one size
(``measure_profiles.measure_after_compute``).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from bench_distributed import add_backend_argument, realtime_threads, start_backend
from measure_profiles import AFTER_KINDS, after_compute, collective, products


def command_line() -> argparse.ArgumentParser:
    """The probe's options; ``--backend`` gloo by default, also where one GPU per rank
    makes nccl the other scripts' default."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4,64,1024", help="KiB per rank, comma list (default %(default)s)")
    parser.add_argument("--gaps", default="0,0.3,1,3", help="ms of compute before each call (default %(default)s)")
    parser.add_argument("--reps", type=int, default=5)
    add_backend_argument(parser)
    parser.set_defaults(backend="gloo")
    return parser


def main() -> None:
    parser = command_line()
    args = parser.parse_args()
    if args.backend != "gloo":
        parser.error("--backend: the probe times products on the CPU, so gloo only")
    torch.set_num_threads(1)
    start_backend(parser, args)
    # read back, so that the header says what the timings ran with
    realtime = f", {len(realtime_threads())} gloo threads real-time" if args.realtime_gloo else ""
    world = dist.get_world_size()
    if world < 2:
        parser.error("run it on two ranks or more (torchrun --nproc-per-node W)")
    sizes = [int(s) for s in args.sizes.split(",")]
    gaps = [float(g) for g in args.gaps.split(",")]
    if dist.get_rank() == 0:
        print(f"# world {world}, gloo{realtime}, torch {torch.__version__}, median of {args.reps} timings, ms per call")
        print(f"{'kind':24s} {'KiB':>5s} {'gap ms':>7s} {'alone':>7s} {'after':>7s} {'extra':>7s}")
    for kind in AFTER_KINDS:
        for kib in sizes:
            call = collective(kind, kib * 1024, world)
            for gap in gaps:
                alone, compute, after = after_compute(call, products(gap * 1e-3) if gap else None, args.reps)
                if dist.get_rank() == 0:
                    print(f"{kind:24s} {kib:5d} {compute * 1e3:7.2f} {alone * 1e3:7.3f} {after * 1e3:7.3f} "
                          f"{(after - alone) * 1e3:+7.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

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
after compute").
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
import torch.distributed as dist

from bench_distributed import add_backend_argument, realtime_threads, start_backend, timed
from measure_profiles import collective

KINDS = ("all_to_all_single", "all_gather_into_tensor")
CALLS_SECONDS = 0.2  # each timing lasts about this long


def seconds_per_call(fn: Callable[[], object], calls: int) -> float:
    """Seconds per call of ``fn`` over ``calls`` calls in a row, the slowest rank's
    (bench_distributed's :func:`timed`: after a barrier)."""

    def repeated() -> None:
        for _ in range(calls):
            fn()

    return timed(repeated) / calls


def products(seconds: float) -> Callable[[], None]:
    """bf16 products of a batch of eight 96 x 96 matrices (a small bucket's Newton–Schulz
    size), as many as take about ``seconds`` on this rank, one at least (the same count on
    every rank)."""
    a, b = torch.randn(8, 96, 96).bfloat16(), torch.randn(8, 96, 96).bfloat16()
    per = seconds_per_call(lambda: torch.bmm(a, b), 200)
    count = max(1, round(seconds / per))  # one at least, however slow the host

    def run() -> None:
        for _ in range(count):
            torch.bmm(a, b)

    return run


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
    for kind in KINDS:
        for kib in sizes:
            call = collective(kind, kib * 1024, world)
            once = seconds_per_call(call, 10)
            for gap in gaps:
                work = products(gap * 1e-3) if gap else None
                then_call = (lambda: (work(), call())) if work else call
                n = max(10, round(CALLS_SECONDS / (gap * 1e-3 + once)))
                rows = []
                for _ in range(args.reps):
                    alone = seconds_per_call(call, n)
                    compute = seconds_per_call(work, n) if work else 0.0
                    both = seconds_per_call(then_call, n)
                    rows.append((alone, compute, both - compute))
                alone, compute, after = (statistics.median(column) for column in zip(*rows))
                if dist.get_rank() == 0:
                    print(f"{kind:24s} {kib:5d} {compute * 1e3:7.2f} {alone * 1e3:7.3f} {after * 1e3:7.3f} "
                          f"{(after - alone) * 1e3:+7.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

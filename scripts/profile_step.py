"""Where a compiled distributed Muon step's time goes: its kernels, per step, on one rank.

    torchrun --nproc-per-node 2 scripts/profile_step.py [--workload gpt-small]
        [--strategy all_to_all] [--bucket-mb 64] [--prefetch 1] [--steps 3] [--rank 0]

Builds scripts/bench_distributed.py's workload on FSDP2 (gloo on the CPU, NCCL with one GPU
per rank), compiles ``muon_compile.Muon``'s step with ``backend="muon"`` and the given
settings, times it as bench_distributed does (median of 7 after 3 warm-up steps, slowest
rank), then profiles ``--steps`` steps with Inductor's C++ kernels recorded by name
(``cpp.enable_kernel_profile``) and prints the table of self time per step (the
GPU's under NCCL) of rank ``--rank`` (default 0): the matmuls (``aten::bmm``), each
generated pointwise kernel (``graph_N_cpp_fused_*`` on the CPU), the collectives' waits.
The cost model's prediction for the same plan (scripts/validate_step_cost.py) splits a
step into NS, pointwise and exposed communication; this table is what to hold it
against. The profiler's own cost makes the profiled steps slower than the timed median.

``--host`` prints the host's side instead, under NCCL too: the CPU's self time per op and
the kernel launches per step (the CUDA runtime's and driver's launch calls, and the
kernels the GPU ran), what the cost model's fixed costs stand for on a GPU, where the host
issues the step ahead of the device. ``--trace FILE`` writes the profile as a Chrome
trace. ``--workload`` also takes the fixed-cost steps of scripts/measure_profiles.py
(``"24 shapes"``; its bucket size comes from ``--bucket-mb``). ``--scale K`` multiplies
every matrix's rows and columns by ``K``: a step of the same parameters and buckets with
larger tensors, to see whether the host's time per launch follows the tensors' size (on one
H200 gpt-small's launches cost the host about 1.5 times those of the "24 shapes" step,
docs/benchmarks.md, "GPU: a second H200 lease").

Under gloo it also prints every rank's split of the profiled steps
(scripts/step_split.py: the wall time per step, the self time of its matmuls, of
Inductor's generated kernels and of its collectives, and the rest, what the cost model
counts as fixed costs). ``--predict-from RUN.json``, a run saved by scripts/validate_step_cost.py at the
same world size, prints the cost model's split of the same plan beside it, the profiles
fitted to that run's figures as its report fits them: NS, memory-bound pointwise work,
fixed costs and exposed communication per rank.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
from torch._inductor import config as inductor_config
from torch._inductor.utils import fresh_cache
from torch.distributed.device_mesh import init_device_mesh

from bench_distributed import WORKLOADS, add_backend_argument, our_muon, sharded_params, start_backend, timed_host, timed_steps
from measure_profiles import FIXED_COST_WORKLOADS
from step_split import PARTS, PREDICTED, predicted_split, split
from validate_step_cost import workload_profiles

import muon_compile
from muon_compile import config
from muon_compile.config import Strategy
from muon_compile.plan import plan_for


# the host's calls that launch a kernel on a GPU: the runtime's (cudaLaunchKernel,
# cudaLaunchKernelExC) and the driver's (cuLaunchKernel, cuLaunchKernelEx: Triton's)
LAUNCH_CALL = "LaunchKernel"


def workload_shapes(name: str, scale: int = 1) -> list[tuple[int, int]]:
    """The matrices of a workload of scripts/bench_distributed.py or of a fixed-cost step,
    each side multiplied by ``scale``."""
    shapes = WORKLOADS[name] if name in WORKLOADS else FIXED_COST_WORKLOADS[name][0]
    return [(rows * scale, cols * scale) for rows, cols in shapes]


def launches(events, steps: int) -> tuple[int, int]:
    """Per step: the host's kernel launch calls, and the kernels the device ran."""
    calls = sum(e.count for e in events if LAUNCH_CALL in e.key)
    kernels = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return calls // steps, kernels // steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=[*WORKLOADS, *FIXED_COST_WORKLOADS], default="gpt-small")
    parser.add_argument("--strategy", choices=[s.value for s in Strategy], default=Strategy.ALL_TO_ALL.value)
    parser.add_argument("--bucket-mb", type=float, default=config.Config.bucket_mb)
    parser.add_argument("--prefetch", type=int, default=config.Config.prefetch)
    parser.add_argument("--scale", type=int, default=1, help="every matrix's rows and columns times this (default 1)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=30, help="rows of the printed table")
    parser.add_argument("--rank", type=int, default=0, help="the rank whose profile is printed")
    parser.add_argument("--host", action="store_true", help="print the host's self time per op and the kernel launches per step")
    parser.add_argument("--trace", metavar="JSON", help="write rank --rank's profile as a Chrome trace")
    parser.add_argument("--predict-from", metavar="JSON",
                        help="a run saved by scripts/validate_step_cost.py: print the cost model's split beside the measured one")
    add_backend_argument(parser)
    args = parser.parse_args()
    mesh_device = start_backend(parser, args)
    world = dist.get_world_size()
    if not 0 <= args.rank < world:
        parser.error(f"--rank {args.rank}: the run has ranks 0 to {world - 1}")
    if args.scale < 1:
        parser.error(f"--scale {args.scale}: must be 1 or more")
    shapes = workload_shapes(args.workload, args.scale)
    workload = args.workload + (f" (x{args.scale} sizes)" if args.scale > 1 else "")
    mesh = init_device_mesh(mesh_device, (world,))
    gpu = args.backend == "nccl"
    inductor_config.cpp.enable_kernel_profile = True
    settings = config.override(strategy=args.strategy, bucket_mb=args.bucket_mb, prefetch=args.prefetch)
    with fresh_cache(), settings:
        step = torch.compile(our_muon(sharded_params(shapes, mesh)), backend="muon")
        median = statistics.median(timed_steps(step, 3, 7))
        issued = statistics.median(timed_host(step) for _ in range(7)) if args.host else None
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
        with torch.profiler.profile(activities=activities) as prof:
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            wall = time.perf_counter() - start
    splits = [None] * world
    if not gpu:  # under NCCL the CPU's self time is not the step's
        dist.all_gather_object(splits, split(prof.events(), args.steps, wall))
    if dist.get_rank() == 0 and not gpu:
        print_splits(splits, args, world, workload, shapes)
    if dist.get_rank() == args.rank and args.trace:
        prof.export_chrome_trace(args.trace)
    if dist.get_rank() == args.rank:
        print(
            f"# {workload}, {args.strategy}, bucket {args.bucket_mb:g} MiB, prefetch {args.prefetch}, "
            f"world {world} ({dist.get_backend()}), muon_compile {muon_compile.__version__}, torch {torch.__version__}"
        )
        print(f"step: median {median * 1e3:.2f} ms (slowest rank); rank {args.rank}'s profile of {args.steps} steps, ms per step:")

        events = prof.key_averages()
        if args.host:
            calls, kernels = launches(events, args.steps)
            print(f"host: issued a step in {issued * 1e3:.2f} ms (median of 7, slowest rank), {wall * 1e3 / args.steps:.2f} ms per "
                  f"profiled step; {calls} kernel launch calls, {kernels} device kernels per step")

        def self_us(e) -> float:  # the GPU's time under NCCL, the CPU's under gloo or --host
            return e.self_device_time_total if gpu and not args.host else e.self_cpu_time_total

        for e in sorted(events, key=self_us, reverse=True)[: args.rows]:
            print(f"{self_us(e) / 1e3 / args.steps:9.3f}  {e.count // args.steps:5d} calls  {e.key[:90]}")
    dist.destroy_process_group()


def print_splits(splits: list[dict[str, float]], args, world: int, workload: str, shapes: list[tuple[int, int]]) -> None:
    """Each rank's measured split (:func:`split`) and, with ``--predict-from``, the cost
    model's (:func:`predicted_split`) of ``shapes``, ms per step; ``workload`` names them."""
    print(f"# {workload}, {args.strategy}, bucket {args.bucket_mb:g} MiB, prefetch {args.prefetch}: "
          f"each rank's profiled step, ms per step")
    print("rank  " + "  ".join(f"{k:>11}" for k in PARTS))
    for r, parts in enumerate(splits):
        print(f"{r:4d}  " + "  ".join(f"{parts[k] * 1e3:11.3f}" for k in PARTS))
    if not args.predict_from:
        return
    with open(args.predict_from) as f:
        record = json.load(f)
    if record["world"] != world:
        raise SystemExit(f"--predict-from {args.predict_from}: a run at world {record['world']}, this one is at {world}")
    device, network = workload_profiles(record, args.workload)
    plan = plan_for(shapes, world, Strategy(args.strategy), args.bucket_mb)
    print(f"# the cost model, profiles of {args.predict_from}, ms per step")
    print("rank  " + "  ".join(f"{k:>11}" for k in PREDICTED))
    for r, parts in enumerate(predicted_split(plan, args.prefetch, device, network)):
        print(f"{r:4d}  " + "  ".join(f"{parts[k] * 1e3:11.3f}" for k in PREDICTED))


if __name__ == "__main__":
    main()

"""Whether a compiled step slows down as more instances of the same step are compiled.

    torchrun --standalone --nproc-per-node 1 scripts/probe_compiled_instances.py
        [--workload "24 shapes"] [--instances 8] [--reps 200] [--backend gloo|nccl]

A question about Dynamo, not the package. scripts/validate_step_cost.py compiles every
arm of a workload and the fixed-cost steps in one process (scripts/measure_profiles.py's
``measure_arms``): 18 compiled instances of ``Optimizer.step``'s one code object, each
call looking its instance up among the others' guards, where a user's process holds one.
On one H200 the validation's host issued gpt-small's step 1.7 times slower than
scripts/profile_step.py's, in a process of its own on another machine of the same kind
(docs/benchmarks.md, "GPU: one H200").

Compiles ``--instances`` instances of the fixed-cost step ``--workload``
(scripts/measure_profiles.py's ``FIXED_COST_WORKLOADS``, all_to_all, each on parameters
of its own), and after each new one prints the median of ``--reps`` calls of the first
and of the newest alone, and per call of all of them in turns (bench_distributed's
``timed``: the device's work included, after a barrier); then Dynamo's cache lookup time
per call of the first and the newest instance (profiler self time).
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from bench_distributed import add_backend_argument, start_backend, timed
from measure_profiles import FIXED_COST_WORKLOADS, STRATEGY_ARMS, compiled_arm

from muon_compile.config import Strategy

LOOKUP = "TorchDynamo Cache Lookup"  # the profiler's event of a compiled call's guard checks


def median_ms(fn, reps: int) -> float:
    return statistics.median(timed(fn) for _ in range(reps)) * 1e3


def lookup_us(fn, reps: int) -> float:
    """Dynamo's cache lookup per call of ``fn``, microseconds of profiler self time."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            fn()
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key == LOOKUP) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=list(FIXED_COST_WORKLOADS), default="24 shapes")
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--reps", type=int, default=200)
    add_backend_argument(parser)
    args = parser.parse_args()
    mesh = init_device_mesh(start_backend(parser, args), (dist.get_world_size(),))
    shapes, bucket_mb = FIXED_COST_WORKLOADS[args.workload]
    arm = STRATEGY_ARMS[Strategy.ALL_TO_ALL]
    out = dist.get_rank() == 0
    steps = []
    with torch._dynamo.config.patch(recompile_limit=8 * args.instances):
        for n in range(1, args.instances + 1):
            steps.append(compiled_arm(arm, shapes, mesh, {"bucket_mb": bucket_mb}, 2))

            def in_turns():
                for step in steps:
                    step()

            first, newest = median_ms(steps[0], args.reps), median_ms(steps[-1], args.reps)
            turns = median_ms(in_turns, max(1, args.reps // n)) / n
            if out:
                print(f"{args.workload}, {n} instances: first alone {first:.3f} ms, newest alone {newest:.3f} ms, "
                      f"in turns {turns:.3f} ms per call", flush=True)
        first, newest = lookup_us(steps[0], args.reps), lookup_us(steps[-1], args.reps)
    if out:
        print(f"cache lookup per call: first instance {first:.1f} us, newest {newest:.1f} us")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

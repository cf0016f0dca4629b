"""Validate the cost model on this machine: predicted against measured distributed steps.

    torchrun --nproc-per-node W scripts/validate_step_cost.py [--workload all] [--reps 15]
        [--profile-reps 15]

First the profiles of this run (scripts/measure_profiles.py: gloo links, matmul rates,
memory bandwidth and a compiled step's fixed costs, all ranks at once), because this VM's
speed drifts between days. Then, for each workload of scripts/bench_distributed.py, each
strategy (all_to_all, all_gather), each prefetch depth (0, 1) and two bucket sizes (the
default, one bucket here, and a split into several buckets, where prefetch changes the
schedule): the measured step (bench_distributed's arms, the slowest rank's median) and
the cost model's prediction from the plan of the same shapes
(``muon_compile.plan.plan_for`` and ``muon_compile.step_cost.predict``). Prints every
pair with its error, and per workload, bucket size and depth whether the predicted
ranking of the strategies is the measured one.
"""

from __future__ import annotations

import argparse
import platform
import statistics

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from bench_distributed import WORKLOADS, measure
from measure_profiles import STRATEGY_ARMS, device_profile, network_profile

from muon_compile import config
from muon_compile.config import Config
from muon_compile.plan import plan_for
from muon_compile.step_cost import predict

# a bucket size per workload that splits it into several buckets
SPLIT_MB = {"gpt-small": 4.0, "small-14": 0.02}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--profile-reps", type=int, default=15)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    log = print if rank == 0 else (lambda *_: None)
    log(f"# world {world}, gloo, torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads per rank")
    network = network_profile(args.profile_reps, log)
    device = device_profile(network, args.profile_reps, log)
    mesh = init_device_mesh("cpu", (world,))
    log(f"\n{'workload':<10} {'bucket MiB':>10} {'buckets':>7} {'strategy':<10} {'prefetch':>8} "
        f"{'predicted ms':>12} {'(NS':>7} {'pointwise':>9} {'exposed)':>9} {'measured ms':>11} {'error':>7}")
    errors = []
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    for name in names:
        shapes = WORKLOADS[name]
        for mb in (Config.bucket_mb, SPLIT_MB[name]):
            for prefetch in (0, 1):
                pair = {}
                for strategy, arm in STRATEGY_ARMS.items():
                    plan = plan_for(shapes, world, strategy, mb)
                    cost = predict(plan, prefetch, device, network)
                    with config.override(bucket_mb=mb, prefetch=prefetch):
                        result = measure(arm, shapes, mesh, args.warmup, args.reps)
                    if "error" in result:
                        log(f"{name:<10} {mb:>10g} {strategy.value}: measurement failed: {result['error']}")
                        continue
                    measured = statistics.median(result["times"])
                    error = cost.step / measured - 1
                    errors.append(abs(error))
                    pair[strategy] = (cost.step, measured)
                    r = cost.slowest_rank
                    log(f"{name:<10} {mb:>10g} {len(plan.buckets):>7} {strategy.value:<10} {prefetch:>8} "
                        f"{cost.step * 1e3:>12.2f} {cost.ns[r] * 1e3:>7.2f} {cost.pointwise[r] * 1e3:>9.2f} "
                        f"{cost.exposed[r] * 1e3:>9.2f} {measured * 1e3:>11.2f} {error:>+7.1%}")
                if len(pair) == 2:
                    order = [sorted(pair, key=lambda s: pair[s][i]) for i in (0, 1)]
                    verdict = "matches" if order[0] == order[1] else "DIFFERS"
                    log(f"{'':<10} ranking {' < '.join(s.value for s in order[1])} measured, "
                        f"{' < '.join(s.value for s in order[0])} predicted: {verdict}")
    if errors:
        log(f"\n{len(errors)} pairs: median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%}, "
            f"within 20%: {sum(e <= 0.2 for e in errors)}/{len(errors)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

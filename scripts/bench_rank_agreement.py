"""What the rank-agreement check costs a compilation (muon_compile.rank_agreement).

    torchrun --nproc-per-node 2 scripts/bench_rank_agreement.py [--workload gpt-small] [--reps 20]

Compiles the Muon step of ``scripts/bench_distributed.py``'s FSDP2 workload once (fresh
Inductor cache), then reports, from the slowest rank:

    compile        the whole cold compilation of the step, the check included
    fingerprint    building the fingerprint from the Dynamo graph (once per compilation)
    exchange       one exchange of it through the store: the median over ``--reps``
                   exchanges of the same fingerprint, each after a barrier, so it is the
                   check's own cost, not the wait for a slower rank
    facts          the fingerprint's size: facts per process group and JSON bytes
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch._inductor.utils import fresh_cache
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_distributed import WORKLOADS, add_backend_argument, machine, sharded_params, slowest, start_backend  # noqa: E402

import muon_compile  # noqa: E402
from muon_compile import rank_agreement  # noqa: E402
from muon_compile.stats import pass_seconds  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=list(WORKLOADS), default="gpt-small")
    parser.add_argument("--reps", type=int, default=20)
    add_backend_argument(parser)
    args = parser.parse_args()
    device = start_backend(parser, args)
    world = dist.get_world_size()
    mesh = init_device_mesh(device, (world,))
    params = sharded_params(WORKLOADS[args.workload], mesh)
    opt = muon_compile.Muon(params, lr=0.02)

    seen: list[dict] = []
    original = rank_agreement.agree

    def recording(groups, timeout, compilation=None):
        seen.append(groups)
        original(groups, timeout, compilation)

    rank_agreement.agree = recording
    with fresh_cache():
        dist.barrier()
        start = time.perf_counter()
        torch.compile(opt.step, backend="muon")()
        compile_s = slowest(time.perf_counter() - start)
    rank_agreement.agree = original
    groups = seen[-1]
    exchanges = []
    for _ in range(args.reps):
        dist.barrier()
        start = time.perf_counter()
        rank_agreement.agree(groups, 60)
        exchanges.append(slowest(time.perf_counter() - start))
    fingerprint_s = slowest(pass_seconds["fingerprint"] / max(len(seen), 1))
    if dist.get_rank() == 0:
        facts = {name: len(f) for name, f in groups.items()}
        size = len(json.dumps(groups))
        print(f"# rank agreement, {args.workload} ({len(params)} matrices), world {world}, {args.backend}; {machine()}")
        print(f"compile      {compile_s:8.2f} s (cold, {len(seen)} backend call(s))")
        print(f"fingerprint  {fingerprint_s * 1e3:8.2f} ms per backend call")
        print(
            f"exchange     {statistics.median(exchanges) * 1e3:8.2f} ms median of {args.reps} "
            f"(min {min(exchanges) * 1e3:.2f}, max {max(exchanges) * 1e3:.2f})"
        )
        print(f"facts        {facts} per group, {size} bytes of JSON")
        share = (fingerprint_s + statistics.median(exchanges)) * len(seen) / compile_s
        print(f"share of the compile: {share:.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

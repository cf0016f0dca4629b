"""Whether what runs just before a compiled step changes the step's time.

    torchrun --standalone --nproc-per-node 2 scripts/probe_step_after.py [--realtime-gloo]
        [--blocks 10] [--reps 30]

A question about the host, not the package. scripts/validate_step_cost.py times its arms
in turns with each other and with the probes (scripts/measure_profiles.py's
``measure_arms``), and a step measures slower there than alone: the one-bucket
``small-14`` step at world 2 was profiled at 3.2-3.5 ms in turns and 1.8-2.1 ms alone
(docs/benchmarks.md, "A fixed cost per collective"). Here that step (all_to_all,
prefetch 0) is timed after each of several preludes, one prelude call before each timed
step (bench_distributed's ``timed``: the slowest rank's time after a barrier):

    nothing            the step back to back
    twin               another compiled instance of the same plan, on parameters of its own
    other step         the ten-bucket all_gather step of the same matrices
    bf16 product       one bmm of PROBE_SIZE products in bf16, batched as the profile's table
    matmul probe       the validation's matmul probe (products for about 50 ms)
    write 64 MiB       a pointwise pass over 64 MiB, which evicts the caches
    sleep 5 ms         the rank idle

Each prelude's steps run in ``--blocks`` blocks of ``--reps``, the blocks of all preludes
in an order shuffled the same on every rank, so a slow spell of the VM spreads over them.
Prints each prelude's median and quartiles in ms.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import torch.distributed as dist
from torch._inductor.utils import fresh_cache
from torch.distributed.device_mesh import init_device_mesh

from bench_distributed import WORKLOADS, add_backend_argument, start_backend, timed
from measure_matmul_rates import matmul_batch
from measure_profiles import PROBE_SIZE, compiled_arm, probe
from validate_step_cost import SPLIT_MB

from muon_compile.config import Config

WORKLOAD = "small-14"
# the step timed, and its twin: an arm of bench_distributed, and its config
STEP_ARM, STEP_CONFIG = "muon-a2a", {"bucket_mb": Config.bucket_mb, "prefetch": 0}
FLUSH_BYTES = 64 * 2**20  # well past a core's L2 (2 MiB on the VMs of these runs)
SLEEP_S = 0.005


def preludes(shapes: list, mesh) -> dict:
    """The calls to time the step after, by name (the module docstring's table)."""
    batch = matmul_batch(PROBE_SIZE)
    a = torch.randn(batch, PROBE_SIZE, PROBE_SIZE, dtype=torch.bfloat16)
    flushed = torch.zeros(FLUSH_BYTES // 4)
    return {
        "nothing": lambda: None,
        "twin": compiled_arm(STEP_ARM, shapes, mesh, STEP_CONFIG, 2),
        "other step": compiled_arm("muon-gather", shapes, mesh, {"bucket_mb": SPLIT_MB[WORKLOAD], "prefetch": 0}, 2),
        "bf16 product": lambda: torch.bmm(a, a),
        "matmul probe": probe()[0],
        "write 64 MiB": lambda: flushed.add_(1.0),
        f"sleep {SLEEP_S * 1e3:g} ms": lambda: time.sleep(SLEEP_S),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_backend_argument(parser)
    parser.add_argument("--blocks", type=int, default=10, help="blocks of steps per prelude")
    parser.add_argument("--reps", type=int, default=30, help="timed steps per block")
    args = parser.parse_args()
    if args.blocks < 1 or args.reps < 1:
        parser.error(f"--blocks {args.blocks} --reps {args.reps}: at least 1 each")
    torch.set_num_threads(1)
    device = start_backend(parser, args)
    if device != "cpu":
        parser.error("a question about the CPU host: run it with gloo")
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    shapes = WORKLOADS[WORKLOAD]
    with fresh_cache():  # one cache for the three compiled steps, as measure_arms compiles its arms
        step = compiled_arm(STEP_ARM, shapes, mesh, STEP_CONFIG, 2)
        calls = preludes(shapes, mesh)
    times: dict[str, list[float]] = {name: [] for name in calls}
    blocks = [name for name in calls for _ in range(args.blocks)]
    random.Random(0).shuffle(blocks)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for name in blocks:
            for _ in range(args.reps):
                calls[name]()
                times[name].append(timed(step))
    if dist.get_rank() == 0:
        print(f"world {dist.get_world_size()}, {WORKLOAD} one-bucket all_to_all step, prefetch 0, "
              f"after each prelude ({args.blocks} blocks of {args.reps} steps, ms):")
        for name, series in times.items():
            q1, median, q3 = statistics.quantiles(series, n=4)
            print(f"  {name:16s} median {median * 1e3:6.2f}  quartiles {q1 * 1e3:6.2f} {q3 * 1e3:6.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

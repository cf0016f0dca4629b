"""Plan a distributed Muon step for a cluster this machine cannot hold: predicted step
times per strategy, bucket size and prefetch depth, from shapes alone.

    python -m muon_compile.plan --model llama-8b --world 8,64,1024 \\
        [--device h100] [--network nvlink-ib] [--bucket-mb 64,256,1024] [--prefetch 0,1,2] \\
        [--shard 8,64] [--tokens 4194304] [--mfu 0.4]

The matrices of the model (:mod:`muon_compile.model_shapes`) become the sharded
Newton–Schulz sites an FSDP2 run over ``world`` ranks would have (one process group,
``torch.chunk`` rows), planned by the distribute pass's own planner
(:func:`~muon_compile.passes.plan_distributed.plan_distributed`) and priced by the cost
model (:func:`muon_compile.step_cost.predict`). Besides FSDP over the whole world, HSDP
layouts are tried: Muon's collectives then run within shard groups of ``--shard`` ranks,
and the replica groups repeat the step without communicating in it (the gradient
all-reduce across replicas belongs to the backward pass, not priced here). For each
world size it prints, per layout, strategy and bucket size, at the best prefetch depth,
the predicted optimizer step, its NS, pointwise and exposed-communication parts, and
recommends the fastest configuration; then Muon's
share of a training step of ``--tokens`` tokens at ``--mfu`` of the device's bf16 matmul
rate (forward and backward at ``6 * active parameters`` FLOPs per token).
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from . import coefficients
from .config import Config, Strategy
from .model_shapes import MODELS, ModelShapes, model
from .network_profiles import PROFILES as NETWORKS
from .network_profiles import NetworkProfile
from .ns_args import NSArgs
from .passes.find import NSSite, Sharding
from .passes.plan_distributed import DistPlan, plan_distributed
from .sharded_ns import row_shard
from .step_cost import DEVICES, DeviceProfile, StepCost, predict

# muon_compile.Muon's defaults: Keller's quintic, 5 steps, bf16, the algorithm chosen per shape
DEFAULT_ARGS = coefficients.ns_args("keller", 5)


def sharded_sites(
    shapes: list[tuple[int, int]], world: int, args: NSArgs = DEFAULT_ARGS, rank: int = 0, group: str = "0"
) -> list[NSSite]:
    """The NS sites of FSDP2-sharded fp32 ``(rows, cols)`` matrices over ``world`` ranks
    of process group ``group``, as the find pass reads them from ``rank``'s graph."""
    return [
        NSSite(i, 1, rows, cols, 2, torch.float32, "cuda", args, 0, None, Sharding(group, world, rank, row_shard(rows, world, rank)))
        for i, (rows, cols) in enumerate(shapes)
    ]


def plan_for(shapes: list[tuple[int, int]], world: int, strategy: Strategy, bucket_mb: float, args: NSArgs = DEFAULT_ARGS) -> DistPlan:
    """The distribution plan of ``shapes`` over ``world`` ranks (see :func:`sharded_sites`)."""
    return plan_distributed(sharded_sites(shapes, world, args), bucket_mb=bucket_mb, strategy=strategy)


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One configuration's predicted step: Muon's collectives over shard groups of
    ``shard`` of the ``world`` ranks (FSDP when they are equal, HSDP otherwise: the
    replicas repeat the same step, without communicating in it)."""

    world: int
    shard: int
    strategy: Strategy
    bucket_mb: float
    prefetch: int
    buckets: int
    cost: StepCost

    @property
    def layout(self) -> str:
        return "FSDP" if self.shard == self.world else f"HSDP {self.world // self.shard}x{self.shard}"

    @property
    def exposed_share(self) -> float:
        """The slowest rank's exposed communication as a share of the step."""
        return self.cost.exposed[self.cost.slowest_rank] / self.cost.step if self.cost.step else 0.0


def shard_sizes(world: int, candidates: list[int]) -> list[int]:
    """The shard group sizes among ``candidates`` that divide ``world``, and ``world`` itself."""
    return sorted({s for s in candidates if 0 < s < world and world % s == 0} | {world})


def sweep(
    shapes: list[tuple[int, int]],
    world: int,
    device: DeviceProfile,
    network: NetworkProfile,
    bucket_mbs: list[float],
    prefetches: list[int],
    shards: list[int] = (),
    strategies: tuple[Strategy, ...] = (Strategy.ALL_TO_ALL, Strategy.ALL_GATHER),
) -> list[Prediction]:
    """Every configuration's :class:`Prediction` at ``world`` ranks, for each shard group
    size of :func:`shard_sizes` (``shards``)."""
    rows = []
    for shard in shard_sizes(world, list(shards)):
        for strategy in strategies:
            for mb in bucket_mbs:
                plan = plan_for(shapes, shard, strategy, mb)
                for k in prefetches:
                    cost = predict(plan, k, device, network)
                    rows.append(Prediction(world, shard, strategy, mb, k, len(plan.buckets), cost))
    return rows


def best(predictions: list[Prediction]) -> Prediction:
    """The fastest configuration (ties: the earlier one)."""
    return min(predictions, key=lambda p: p.cost.step)


def training_seconds(shapes: ModelShapes, tokens: int, world: int, device: DeviceProfile, mfu: float) -> float:
    """Seconds of the forward and backward pass of ``tokens`` tokens over ``world``
    devices at ``mfu`` of the device's largest-size bf16 matmul rate."""
    peak = device.matmul.tables[torch.bfloat16][-1][1] * 1e9
    return 6 * shapes.active * tokens / (world * peak * mfu)


def describe(predictions: list[Prediction]) -> str:
    """One line per layout, strategy and bucket size at its best prefetch depth, the
    fastest configuration marked."""
    fastest = best(predictions)
    at_best_depth: dict[tuple, Prediction] = {}
    for p in predictions:
        key = (p.shard, p.strategy, p.bucket_mb)
        if key not in at_best_depth or p.cost.step < at_best_depth[key].cost.step:
            at_best_depth[key] = p
    lines = [
        f"{'layout':<12} {'strategy':<10} {'bucket MiB':>10} {'buckets':>7} {'prefetch':>8} "
        f"{'step ms':>9} {'NS ms':>8} {'pointwise ms':>12} {'exposed comm':>12}"
    ]
    for p in at_best_depth.values():
        r = p.cost.slowest_rank
        mark = "  <- fastest" if p is fastest else ""
        lines.append(
            f"{p.layout:<12} {p.strategy.value:<10} {p.bucket_mb:>10g} {p.buckets:>7} {p.prefetch:>8} "
            f"{p.cost.step * 1e3:>9.2f} {p.cost.ns[r] * 1e3:>8.2f} {p.cost.pointwise[r] * 1e3:>12.2f} "
            f"{p.exposed_share:>12.1%}{mark}"
        )
    return "\n".join(lines)


def _numbers(text: str, kind: type) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m muon_compile.plan", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, choices=sorted(MODELS))
    parser.add_argument("--world", default="8,64,1024", help="comma list of world sizes (default %(default)s)")
    parser.add_argument("--device", default="h100", choices=sorted(DEVICES))
    parser.add_argument("--network", default="nvlink-ib", choices=sorted(NETWORKS))
    parser.add_argument("--bucket-mb", default=f"{Config.bucket_mb:g},256,1024", help="comma list (default %(default)s)")
    parser.add_argument(
        "--shard", default="8,64", help="comma list of HSDP shard group sizes tried besides FSDP over the world (default %(default)s)"
    )
    parser.add_argument("--prefetch", default="0,1,2", help="comma list of depths (default %(default)s)")
    parser.add_argument("--tokens", type=int, default=4 * 2**20, help="tokens per training step (default %(default)s)")
    parser.add_argument("--mfu", type=float, default=0.4, help="forward/backward matmul utilisation (default %(default)s)")
    args = parser.parse_args(argv)
    shapes, device, network = model(args.model), DEVICES[args.device], NETWORKS[args.network]
    try:
        worlds, mbs, depths = _numbers(args.world, int), _numbers(args.bucket_mb, float), _numbers(args.prefetch, int)
        shards = _numbers(args.shard, int)
    except ValueError as e:
        parser.error(f"--world, --bucket-mb, --prefetch and --shard take comma lists of numbers: {e}")
    if min(worlds + shards, default=1) < 1 or min(mbs, default=1) <= 0 or min(depths, default=0) < 0:
        parser.error("world and shard sizes must be >= 1, bucket sizes > 0, prefetch depths >= 0")
    print(f"{shapes.name} ({shapes.source}): {len(shapes.matrices)} Muon matrices, {shapes.muon_params / 1e9:.2f}B parameters")
    print(f"device {device.name}: {device.source}")
    print(f"network {network.name}: {network.source}")
    for world in worlds:
        predictions = sweep(list(shapes.matrices), world, device, network, mbs, depths, shards)
        chosen = best(predictions)
        train = training_seconds(shapes, args.tokens, world, device, args.mfu)
        print(f"\n=== world {world} ===")
        print(describe(predictions))
        print(
            f"recommended: {chosen.layout}, MUON_COMPILE_STRATEGY={chosen.strategy.value} MUON_COMPILE_BUCKET_MB={chosen.bucket_mb:g} "
            f"MUON_COMPILE_PREFETCH={chosen.prefetch}: {chosen.cost.step * 1e3:.2f} ms per step; "
            f"{chosen.cost.step / (chosen.cost.step + train):.2%} of a training step of {args.tokens} tokens "
            f"({train * 1e3:.1f} ms forward and backward at {args.mfu:.0%} MFU)"
        )


if __name__ == "__main__":
    main()

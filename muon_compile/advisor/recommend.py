"""Plan a distributed Muon step for a cluster this machine cannot hold: predicted step
times per strategy, bucket size and prefetch depth, from shapes alone.

    python -m muon_compile.advisor --model llama-8b --world 8,64,1024 \\
        [--device h100 | --profile FILE] [--network nvlink-ib] [--bucket-mb 64,256,1024,4096,16384] \\
        [--prefetch 0,1,2] [--shard 8,64] [--tp 8] [--memory-share 0.25] [--tokens 4194304] [--mfu 0.4]

The matrices of the model (:mod:`muon_compile.models`) become the sharded
Newton–Schulz sites an FSDP2 run over ``world`` ranks would have (one process group,
``torch.chunk`` rows), planned by the distribute pass's own advisor
(:func:`~muon_compile.passes.distribute.plan.plan_distributed`) and priced by the cost
model (:func:`muon_compile.advisor.step_cost.predict`). Besides FSDP over the whole world, HSDP
layouts are tried: Muon's collectives then run within shard groups of ``--shard`` ranks,
and the replica groups repeat the step without communicating in it (the gradient
all-reduce across replicas belongs to the backward pass, not priced here). With ``--tp T``
the matrices are tensor-parallel first (Megatron's layout, ``Model.tp_split``) and FSDP2
shards the rest over ``world / T`` (a shard group is then ``T`` times a data-parallel group),
and every TP mode is priced (:class:`~muon_compile.config.TPMode`): ``distributed`` and
``duplicated`` on the whole matrices, ``blockwise`` on each TP block over the data-parallel
ranks alone; the recommendation is the fastest exact mode, and ``blockwise``, a different
optimizer, is shown beside it. For each
world size it prints, per layout, strategy and bucket size, at the best prefetch depth,
the predicted optimizer step, its NS, pointwise, exposed-communication and launch-bound
(the device waiting for the host) parts and its
bucket buffers (:func:`~muon_compile.advisor.step_cost.buffer_bytes`), and recommends the fastest
configuration whose buffers fit in ``--memory-share`` of the device's memory (the rest
holds the model, its gradients, optimizer state and activations) and whose ranks' share of
the Muon parameters' fp32 weights, gradients and momentum (:func:`state_bytes`) fits in
the device at all; then Muon's share of a
training step of ``--tokens`` tokens at ``--mfu`` of the device's bf16 matmul rate
(forward and backward at ``6 * active parameters`` FLOPs per token); then what it would
recommend if every all-to-all overlapped its peer exchanges, paying one latency instead
of ``W - 1`` (:func:`with_overlapped_exchanges`): the network profile's all-to-all
latency is the model's least certain figure at hundreds of ranks, and the two
recommendations bound it.

The device and the network are built-in profiles (``--device``, ``--network``:
:data:`~muon_compile.advisor.step_cost.DEVICES`,
:data:`~muon_compile.advisor.network_profiles.PROFILES`), or those of a profile file
(``--profile``, :mod:`muon_compile.advisor.profiles`) that
:mod:`muon_compile.advisor.calibrate` measured on the user's own machine: its device in
place of ``--device``, and where it has one, its network in place of ``--network``.

Bucket sizes are swept up to 16 GiB by default: a bucket gives work to as many owners
as it has matrices, so a model of large matrices over many ranks needs large buckets
(``llama-70b``'s FFN matrices are 448 MiB each in bf16).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from ..config import Config, Strategy, TPMode
from ..distributed.sharded_op import ShardLayout
from ..ns import coefficients
from ..ns.args import NSArgs
from ..passes.bucket.plan import plan_buckets
from ..passes.distribute.plan import DistBucket, DistMember, DistPlan, plan_distributed
from ..passes.find import NSSite, Sharding
from . import profiles
from ..models import MODELS, Model, model
from .network_profiles import PROFILES as NETWORKS
from .network_profiles import NetworkProfile
from .step_cost import DEVICES, TIE, DeviceProfile, StepCost, buffer_bytes, predict, tied

# muon_compile.Muon's defaults: Keller's quintic, 5 steps, bf16, the algorithm chosen per shape
DEFAULT_ARGS = coefficients.ns_args("keller", 5)
# the process group of a one-rank plan (local_plan): its step has no collective
LOCAL_GROUP = "local"
# what the advisor sweeps unless told otherwise
BUCKET_MBS = (Config.bucket_mb, 256.0, 1024.0, 4096.0, 16384.0)
PREFETCHES = (0, 1, 2)
SHARDS = (8, 64)
# the share of a device's memory the step's bucket buffers may take
MEMORY_SHARE = 0.25
# bytes per Muon parameter a rank holds of its shard before any buffer: the fp32 weight,
# its gradient and its momentum
STATE_BYTES = 12


def sharded_sites(
    shapes: list[tuple[int, int]],
    world: int,
    args: NSArgs = DEFAULT_ARGS,
    rank: int = 0,
    group: str = "0",
    tp: int = 1,
    tp_split: tuple[int, ...] = (),
    mode: TPMode = TPMode.DISTRIBUTED,
) -> list[NSSite]:
    """The NS sites of FSDP2-sharded fp32 ``(rows, cols)`` matrices over ``world`` ranks
    of process group ``group``, as the find pass reads them from ``rank``'s graph; with
    ``tp`` > 1, tensor-parallel first on ``tp_split[i]`` (:func:`tp_layout`)."""
    layouts = [tp_layout(rows, cols, world, group, tp, tp_split[i] if tp > 1 else 0, mode) for i, (rows, cols) in enumerate(shapes)]
    return [
        NSSite(i, 1, layout.rows, layout.cols, 2, torch.float32, "cuda", args, 0, None, Sharding(layout, rank))
        for i, layout in enumerate(layouts)
    ]


def tp_layout(rows: int, cols: int, world: int, group: str, tp: int, dim: int, mode: TPMode) -> ShardLayout:
    """The layout the routing gives a ``rows x cols`` matrix that tensor parallelism over
    ``tp`` ranks shards on ``dim`` and FSDP2 shards again over ``world / tp`` (FSDP2 alone at
    ``tp`` 1); under ``blockwise``, one TP block (the first, the largest) over the
    data-parallel ranks."""
    dp = world // tp
    if tp == 1:
        return ShardLayout.row_chunks(rows, cols, group, world)
    if mode is TPMode.BLOCKWISE:
        block = (-(-rows // tp), cols) if dim == 0 else (rows, -(-cols // tp))
        return dataclasses.replace(ShardLayout.row_chunks(*block, group, dp), tp_mode=mode.value)
    if dp == 1:
        return ShardLayout(rows, cols, group, (tp,), (dim,), (0,), mode.value)
    return ShardLayout(rows, cols, group, (dp, tp), (0, dim), (tp if dim == 0 else 0, 0), mode.value)


def plan_for(
    shapes: list[tuple[int, int]],
    world: int,
    strategy: Strategy,
    bucket_mb: float,
    args: NSArgs = DEFAULT_ARGS,
    tp: int = 1,
    tp_split: tuple[int, ...] = (),
    mode: TPMode = TPMode.DISTRIBUTED,
) -> DistPlan:
    """The plan of the step the passes compile for FSDP2-sharded ``shapes`` over ``world``
    ranks (``tp`` > 1: tensor-parallel first, see :func:`sharded_sites`), and on a group of
    one rank the single-device path's (:func:`local_plan`)."""
    sites = sharded_sites(shapes, world, args, tp=tp, tp_split=tp_split, mode=mode)
    if sites and sites[0].sharding.group_size == 1:
        return local_plan([(site.rows, site.cols) for site in sites], bucket_mb, args)
    return plan_distributed(sites, bucket_mb=bucket_mb, strategy=strategy)


def local_plan(shapes: list[tuple[int, int]], bucket_mb: float, args: NSArgs = DEFAULT_ARGS) -> DistPlan:
    """The single-device step's plan of ``shapes``, as a plan of groups of one rank. A mesh
    of one rank lays a parameter out as a local tensor (:func:`muon_compile.distributed.routing.layout_of`),
    so the step of a one-rank run is the bucket pass's
    (:func:`~muon_compile.passes.bucket.plan.plan_buckets`): buckets of one shape, one NS
    call each, no collective, the same step whatever the strategy: its buckets are
    ``all_gather``'s for the cost model (no finishing stage; no shard to cut back into).
    The distribute pass's plan of the same matrices would mix shapes in a bucket, one NS
    call per shape (gpt-small at 4 MiB: 7 buckets and 21 calls, where the step makes 10
    of each)."""
    sites = [NSSite(i, 1, rows, cols, 2, torch.float32, "cuda", args, 0) for i, (rows, cols) in enumerate(shapes)]
    buckets = []
    for b in plan_buckets(sites, bucket_mb=bucket_mb, pad_waste=Config.pad_waste).buckets:
        members = []
        for m in b.members:  # each as the bucket's matrices, padded, in the site's orientation
            rows, cols = (b.cols, b.rows) if m.transpose else (b.rows, b.cols)
            members.append(DistMember(m.site, ShardLayout.row_chunks(rows, cols, LOCAL_GROUP, 1), rows, cols, 0, args.steps))
        buckets.append(DistBucket(LOCAL_GROUP, 1, 0, Strategy.ALL_GATHER, args, tuple(members)))
    flops = sum(m.flops for b in buckets for m in b.members)
    return DistPlan(tuple(buckets), (), {LOCAL_GROUP: (flops,)} if buckets else {})


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
    buffers: int  # bytes, see muon_compile.advisor.step_cost.buffer_bytes
    state_fits: bool = True  # whether the state fits in the device's memory (unknown: it does)
    tp: int = 1
    mode: TPMode = TPMode.DISTRIBUTED

    @property
    def settings(self) -> tuple:
        """What the user chooses: shard group size, strategy, bucket size, prefetch depth, TP mode."""
        return self.shard, self.strategy, self.bucket_mb, self.prefetch, self.mode

    @property
    def layout(self) -> str:
        dp = self.shard // self.tp
        if self.tp == 1:
            return "FSDP" if self.shard == self.world else f"HSDP {self.world // self.shard}x{self.shard}"
        if dp == 1:
            return f"TP {self.tp}" if self.shard == self.world else f"{self.world // self.shard} replicas x TP {self.tp}"
        fsdp = f"FSDP {dp}" if self.shard == self.world else f"HSDP {self.world // self.shard}x{dp}"
        return f"{fsdp} x TP {self.tp}"

    @property
    def exact(self) -> bool:
        """Whether the step is Muon's exact update (``blockwise`` is not)."""
        return self.mode is not TPMode.BLOCKWISE

    def fits(self, max_buffers: float) -> bool:
        """Whether its buffers take at most ``max_buffers`` bytes (0: no limit), its state
        fitting in the device."""
        return self.state_fits and (not max_buffers or self.buffers <= max_buffers)

    @property
    def exposed_share(self) -> float:
        """The slowest rank's exposed communication as a share of the step."""
        return self.cost.exposed[self.cost.slowest_rank] / self.cost.step if self.cost.step else 0.0

    @property
    def launch_share(self) -> float:
        """The slowest rank's time waiting for its host's launches as a share of the step
        (a launch-bound step: fewer, larger buckets help)."""
        return self.cost.launch_bound[self.cost.slowest_rank] / self.cost.step if self.cost.step else 0.0


def state_bytes(shapes: list[tuple[int, int]], shard: int) -> float:
    """Bytes of a rank's share of the Muon parameters' state when ``shard`` ranks shard
    them (FSDP: the world; HSDP: a shard group): :data:`STATE_BYTES` per parameter."""
    return STATE_BYTES * sum(r * c for r, c in shapes) / shard


def shard_sizes(world: int, candidates: list[int], tp: int = 1) -> list[int]:
    """The shard group sizes among ``candidates`` that divide ``world`` and that ``tp``
    divides, and ``world`` itself."""
    return sorted({s for s in candidates if 0 < s < world and world % s == 0 and s % tp == 0} | {world})


def sweep(
    shapes: list[tuple[int, int]],
    world: int,
    device: DeviceProfile,
    network: NetworkProfile,
    bucket_mbs: list[float],
    prefetches: list[int],
    shards: list[int] = (),
    strategies: tuple[Strategy, ...] = (Strategy.ALL_TO_ALL, Strategy.ALL_GATHER),
    tp: int = 1,
    tp_split: tuple[int, ...] = (),
) -> list[Prediction]:
    """Every configuration's :class:`Prediction` at ``world`` ranks, for each shard group
    size of :func:`shard_sizes` (``shards``) and, with ``tp`` > 1, each TP mode; where one
    rank computes alone (a shard group of one rank, ``blockwise`` over one data-parallel
    rank) or every rank computes every matrix (``duplicated``), the first of ``strategies``
    only: there every strategy compiles to the same step."""
    rows = []
    for shard in shard_sizes(world, list(shards), tp):
        runs = not device.memory or state_bytes(shapes, shard) <= device.memory
        for mode in list(TPMode) if tp > 1 else [TPMode.DISTRIBUTED]:
            alone = shard == 1 or mode is TPMode.DUPLICATED or (mode is TPMode.BLOCKWISE and shard == tp)
            for strategy in strategies[:1] if alone else strategies:
                for mb in bucket_mbs:
                    plan = plan_for(shapes, shard, strategy, mb, tp=tp, tp_split=tp_split, mode=mode)
                    shown = plan.buckets[0].strategy if mode is TPMode.DUPLICATED and plan.buckets else strategy
                    for k in prefetches:
                        cost = predict(plan, k, device, network)
                        buffers = buffer_bytes(plan, k)
                        rows.append(Prediction(world, shard, shown, mb, k, len(plan.buckets), cost, buffers, runs, tp, mode))
    return rows


def with_overlapped_exchanges(
    predictions: list[Prediction],
    shapes: list[tuple[int, int]],
    device: DeviceProfile,
    network: NetworkProfile,
    bucket_mbs: list[float],
    prefetches: list[int],
    shards: list[int] = (),
    tp: int = 1,
    tp_split: tuple[int, ...] = (),
) -> list[Prediction]:
    """``predictions`` (one world size's :func:`sweep`) with the ``all_to_all`` rows priced
    again as if every all-to-all overlapped all its peer exchanges: one latency instead
    of ``W - 1`` (:attr:`~muon_compile.advisor.network_profiles.NetworkProfile.exchanges_in_flight`),
    the bound opposite the default's. NCCL overlaps some; no published figure says how many."""
    world = predictions[0].world
    overlapped = dataclasses.replace(network, exchanges_in_flight=world)
    others = [p for p in predictions if p.strategy is not Strategy.ALL_TO_ALL]
    again = sweep(shapes, world, device, overlapped, bucket_mbs, prefetches, shards, (Strategy.ALL_TO_ALL,), tp, tp_split)
    return others + [p for p in again if p.strategy is Strategy.ALL_TO_ALL]


def best(predictions: list[Prediction], max_buffers: float = 0.0, exact: bool = True) -> Prediction | None:
    """The fastest configuration whose buffers take at most ``max_buffers`` bytes (0: no
    limit; ties: the earlier one), of Muon's exact update unless ``exact`` is False, or
    None when none fits."""
    fitting = [p for p in predictions if p.fits(max_buffers) and (p.exact or not exact)]
    return min(fitting, key=lambda p: p.cost.step, default=None)


def ties(predictions: list[Prediction], chosen: Prediction, max_buffers: float = 0.0) -> list[Prediction]:
    """The fastest configuration of each other layout and strategy whose buffers fit in
    ``max_buffers`` bytes and whose step is predicted within
    :data:`~muon_compile.advisor.step_cost.TIE` of ``chosen``'s: the model cannot rank them
    against it (time both where it matters)."""
    keys = dict.fromkeys((p.shard, p.strategy, p.mode) for p in predictions if p.exact)
    keys.pop((chosen.shard, chosen.strategy, chosen.mode), None)
    rivals = (best([p for p in predictions if (p.shard, p.strategy, p.mode) == key], max_buffers) for key in keys)
    return [p for p in rivals if p is not None and tied(p.cost.step, chosen.cost.step)]


def memory_limit(device: DeviceProfile, share: float = MEMORY_SHARE) -> float:
    """The bytes of bucket buffers the advisor allows on ``device`` (0: its memory is unknown)."""
    return device.memory * share


def training_seconds(shapes: Model, tokens: int, world: int, device: DeviceProfile, mfu: float) -> float:
    """Seconds of the forward and backward pass of ``tokens`` tokens over ``world``
    devices at ``mfu`` of the device's largest-size bf16 matmul rate."""
    peak = device.matmul.tables[torch.bfloat16][-1][1] * 1e9
    return 6 * shapes.active * tokens / (world * peak * mfu)


def describe(predictions: list[Prediction], max_buffers: float = 0.0) -> str:
    """One line per layout, strategy and bucket size at its best prefetch depth among
    those whose buffers fit in ``max_buffers`` bytes (0: no limit), the fastest
    configuration that fits marked; a line none of whose depths fits is shown at its
    smallest buffers and marked."""
    fastest = best(predictions, max_buffers)
    shown: dict[tuple, Prediction] = {}
    for p in predictions:
        key = (p.shard, p.mode, p.strategy, p.bucket_mb)
        held = shown.get(key)
        if held is None or _preference(p, max_buffers) < _preference(held, max_buffers):
            shown[key] = p
    with_tp = any(p.tp > 1 for p in predictions)
    width = 18 if with_tp else 12
    lines = [
        f"{'layout':<{width}} {'tp mode' + ' ' * 6 if with_tp else ''}{'strategy':<10} {'bucket MiB':>10} {'buckets':>7} {'prefetch':>8} "
        f"{'step ms':>9} {'NS ms':>8} {'pointwise ms':>12} {'exposed comm':>12} {'launch-bound':>12} {'buffers GiB':>11}"
    ]
    for p in shown.values():
        r = p.cost.slowest_rank
        mark = "  <- fastest" if p is fastest else "" if p.fits(max_buffers) else "  (over memory)"
        mode = f"{p.mode.value:<12} " if with_tp else ""
        lines.append(
            f"{p.layout:<{width}} {mode}{p.strategy.value:<10} {p.bucket_mb:>10g} {p.buckets:>7} {p.prefetch:>8} "
            f"{p.cost.step * 1e3:>9.2f} {p.cost.ns[r] * 1e3:>8.2f} {p.cost.pointwise[r] * 1e3:>12.2f} "
            f"{p.exposed_share:>12.1%} {p.launch_share:>12.1%} {p.buffers / 2**30:>11.2f}{mark}"
        )
    return "\n".join(lines)


def _preference(p: Prediction, max_buffers: float) -> tuple:
    """Fitting first, then faster; among those that do not fit, smaller buffers."""
    if p.fits(max_buffers):
        return (0, p.cost.step)
    return (1, p.buffers)


def _numbers(text: str, kind: type) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m muon_compile.advisor", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, choices=sorted(MODELS))
    parser.add_argument("--world", default="8,64,1024", help="comma list of world sizes (default %(default)s)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--device", choices=sorted(DEVICES), help="a built-in device profile (default h100)")
    source.add_argument(
        "--profile", type=Path, help="a profile file of python -m muon_compile.advisor.calibrate: its device, and its network where it has one"
    )
    parser.add_argument("--network", choices=sorted(NETWORKS), help="a built-in network profile (default nvlink-ib)")
    parser.add_argument("--bucket-mb", default=_listed(BUCKET_MBS), help="comma list (default %(default)s)")
    parser.add_argument(
        "--shard", default=_listed(SHARDS), help="comma list of HSDP shard group sizes tried besides FSDP over the world (default %(default)s)"
    )
    parser.add_argument("--prefetch", default=_listed(PREFETCHES), help="comma list of depths (default %(default)s)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size: TP first, FSDP2 over the rest (default %(default)s)")
    parser.add_argument(
        "--memory-share", type=float, default=MEMORY_SHARE, help="of the device's memory, the most the bucket buffers may take (default %(default)s)"
    )
    parser.add_argument("--tokens", type=int, default=4 * 2**20, help="tokens per training step (default %(default)s)")
    parser.add_argument("--mfu", type=float, default=0.4, help="forward/backward matmul utilisation (default %(default)s)")
    args = parser.parse_args(argv)
    device, network = DEVICES[args.device or "h100"], NETWORKS[args.network or "nvlink-ib"]
    if args.profile is not None:
        try:
            device, measured = profiles.load(args.profile)
        except (OSError, ValueError) as e:
            parser.error(f"--profile: {e}")
        if measured is not None and args.network is not None:
            parser.error(f"--network {args.network}: the profile {args.profile} has a network of its own")
        network = network if measured is None else measured
    shapes = model(args.model)
    try:
        worlds, mbs, depths = _numbers(args.world, int), _numbers(args.bucket_mb, float), _numbers(args.prefetch, int)
        shards = _numbers(args.shard, int)
    except ValueError as e:
        parser.error(f"--world, --bucket-mb, --prefetch and --shard take comma lists of numbers: {e}")
    if min(worlds + shards, default=1) < 1 or min(mbs, default=1) <= 0 or min(depths, default=0) < 0 or args.tp < 1:
        parser.error("world, shard and tp sizes must be >= 1, bucket sizes > 0, prefetch depths >= 0")
    if not 0 < args.memory_share <= 1:
        parser.error(f"--memory-share must be in (0, 1], got {args.memory_share}")
    limit = memory_limit(device, args.memory_share)
    print(f"{shapes.name} ({shapes.source}): {len(shapes.matrices)} Muon matrices, {shapes.muon_params / 1e9:.2f}B parameters")
    print(f"device {device.name}: {device.source}")
    print(f"network {network.name}: {network.source}")
    if limit:
        print(f"bucket buffers limited to {limit / 2**30:.1f} GiB per device ({args.memory_share:g} of its memory)")
    tp = (args.tp, shapes.tp_split)
    for world in worlds:
        if world % args.tp:
            print(f"\n=== world {world} ===\nskipped: --tp {args.tp} does not divide it")
            continue
        predictions = sweep(list(shapes.matrices), world, device, network, mbs, depths, shards, tp=tp[0], tp_split=tp[1])
        chosen = best(predictions, limit)
        train = training_seconds(shapes, args.tokens, world, device, args.mfu)
        print(f"\n=== world {world} ===")
        print(describe(predictions, limit))
        if chosen is None and not any(p.state_fits for p in predictions):
            state = state_bytes(list(shapes.matrices), world)  # FSDP's, the least of the layouts
            print(f"recommended: none; a rank's fp32 Muon parameters, gradients and momentum take {state / 1e9:.1f} GB "
                  f"or more, over the device's {device.memory / 1e9:.0f} GB: shard over more ranks")
            continue
        if chosen is None:
            smallest = min(p.buffers for p in predictions) / 2**30
            print(f"recommended: none; no configuration's buffers fit in {limit / 2**30:.1f} GiB (the smallest take "
                  f"{smallest:.2f} GiB): shard over more ranks, or try smaller --bucket-mb or a larger --memory-share")
            continue
        print(
            f"recommended: {_configuration(chosen)}; "
            f"{chosen.cost.step / (chosen.cost.step + train):.2%} of a training step of {args.tokens} tokens "
            f"({train * 1e3:.1f} ms forward and backward at {args.mfu:.0%} MFU)"
        )
        for tie in ties(predictions, chosen, limit):
            print(f"    a tie, within {TIE:.0%}: {_configuration(tie)}")
        if (blockwise := best([p for p in predictions if not p.exact], limit, exact=False)) is not None:
            print(f"    not Muon's exact update: {_configuration(blockwise)}")
        overlapped = best(with_overlapped_exchanges(predictions, list(shapes.matrices), device, network, mbs, depths, shards, *tp), limit)
        print(
            "    if every all-to-all overlapped its peer exchanges (1 latency, not W - 1): "
            + (f"the same, {overlapped.cost.step * 1e3:.2f} ms per step" if overlapped.settings == chosen.settings
               else _configuration(overlapped))
        )


def _configuration(p: Prediction) -> str:
    """``p``'s layout, its settings as the environment variables that select them, and its step."""
    mode = f"MUON_COMPILE_TP_MODE={p.mode.value} " if p.tp > 1 else ""
    return (
        f"{p.layout}, {mode}MUON_COMPILE_STRATEGY={p.strategy.value} MUON_COMPILE_BUCKET_MB={p.bucket_mb:g} "
        f"MUON_COMPILE_PREFETCH={p.prefetch}: {p.cost.step * 1e3:.2f} ms per step"
    )


def _listed(values) -> str:
    return ",".join(f"{v:g}" for v in values)


if __name__ == "__main__":
    main()

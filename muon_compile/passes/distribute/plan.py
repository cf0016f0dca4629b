"""plan_distributed: group sharded Newton–Schulz sites into buckets and pick owners.
Plain data in and out.

Algorithm (:func:`plan_distributed`, one or two collectives per bucket):
  1. Set aside unbucketable sites (the op's own gather-NS-slice then runs per matrix).
  2. Key the rest by (process group, NS arguments, level, strategy: ``all_gather`` for the
     ``duplicated`` tensor-parallel mode, else ``strategy``); members of a key, in graph
     order, fill buckets up to ``bucket_mb`` MiB of whole padded matrices in the compute
     dtype. Shapes may mix: the transport is flat, and the owner regroups by shape.
  3. Owners (``all_to_all``): per bucket, members largest-FLOPs-first each go to the rank
     with the least NS FLOPs so far (ties: lowest rank), so every bucket spreads over the
     ranks and the totals stay balanced. ``all_gather``: every rank computes every matrix.
  Only sizes every rank knows enter the plan (global rows, columns, group size), so all
  ranks plan the same buckets, owners and collective sizes.

Before / after (W = 2): sharded sites ``[1152x384, 384x384, 1536x384, 384x1536]`` become
one bucket with owners ``[0, 1, 0, 1]`` (by FLOPs: 1536x384 and 384x1536 first, one
each; then 1152x384 to the lighter rank, 384x384 to the other).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

from muon_compile.config import Strategy, TPMode
from muon_compile.distributed.sharded_op import ShardLayout
from muon_compile.ns.args import NSArgs
from muon_compile.ns.cost import ns_flops

from ..find import NSSite

EVERY_RANK = -1


@dataclasses.dataclass(frozen=True)
class DistMember:
    """A sharded site in a bucket: a matrix laid out as ``shard`` over the bucket's group
    (``batch`` of them, laid out alike, for a stack: ``stacked``), this rank's
    ``local_rows x local_cols`` block of it, every rank's block padded to
    ``rows_per_shard x cols_per_shard`` in transport, orthogonalised by ``owner``."""

    site: int
    shard: ShardLayout
    local_rows: int
    local_cols: int
    owner: int
    steps: int
    batch: int = 1
    stacked: bool = False

    @property
    def rows(self) -> int:
        return self.shard.rows

    @property
    def cols(self) -> int:
        return self.shard.cols

    @property
    def rows_per_shard(self) -> int:
        return self.shard.rows_per_shard

    @property
    def cols_per_shard(self) -> int:
        return self.shard.cols_per_shard

    @property
    def slot(self) -> int:
        """Elements of one rank's padded blocks (``batch`` of them)."""
        return self.batch * self.rows_per_shard * self.cols_per_shard

    @property
    def canonical(self) -> tuple[int, int]:
        return (min(self.rows, self.cols), max(self.rows, self.cols))

    @property
    def layout(self) -> tuple:
        """What a block's place in transport depends on: members of one layout side by side
        form one ``[W, n, rows_per_shard, cols_per_shard]`` block."""
        s = self.shard
        return (s.rows, s.cols, s.rows_per_shard, s.cols_per_shard, s.mesh, s.dims, s.split)

    @property
    def flops(self) -> int:
        return self.batch * ns_flops(self.rows, self.cols, self.steps)

    def describe(self) -> str:
        """``3:7x5 in blocks 2 (rows, tp blockwise)->1``: site, shape, layout unless FSDP2's
        plain row chunks, owner (``all``: every rank). The same on every rank of the group."""
        s = self.shard
        layout = "" if s.is_row_chunks and s.tp_mode == TPMode.DISTRIBUTED.value else f" in blocks {s.describe()}"
        shape = f"{self.batch}x" * self.stacked + f"{self.rows}x{self.cols}"
        return f"{self.site}:{shape}{layout}->{'all' if self.owner == EVERY_RANK else self.owner}"


def by_ns_group(members: Sequence[DistMember]) -> list[tuple[DistMember, ...]]:
    """``members`` grouped by canonical shape (groups in order of first appearance), each
    group sorted by layout (stable: graph order within a layout)."""
    groups: dict[tuple[int, int], list[DistMember]] = {}
    for m in members:
        groups.setdefault(m.canonical, []).append(m)
    return [tuple(sorted(g, key=lambda m: m.layout)) for g in groups.values()]


@dataclasses.dataclass(frozen=True)
class DistBucket:
    """Sharded sites moved by one collective pair (``all_to_all``) or one ``all_gather``."""

    group_name: str
    group_size: int
    rank: int
    strategy: Strategy
    args: NSArgs
    members: tuple[DistMember, ...]

    def computed_by(self, rank: int) -> tuple[DistMember, ...]:
        """The members ``rank`` orthogonalises."""
        return tuple(m for m in self.members if m.owner in (rank, EVERY_RANK))

    def owner_order(self) -> tuple[DistMember, ...]:
        """Members in transport order: by owner (``all_gather``: one block), then as
        :func:`by_ns_group`, so that the members of one layout that a rank orthogonalises lie
        side by side in what it receives."""
        owners = [EVERY_RANK] if self.strategy is Strategy.ALL_GATHER else range(self.group_size)
        return tuple(m for r in owners for g in by_ns_group([m for m in self.members if m.owner == r]) for m in g)

    def split_sizes(self) -> list[int]:
        """Elements each rank owns (all_to_all): what every rank sends to each owner."""
        return [sum(m.slot for m in self.members if m.owner == r) for r in range(self.group_size)]

    def ns_groups(self) -> list[tuple[DistMember, ...]]:
        """This rank's matrices to orthogonalise, grouped by canonical shape (one NS call each)."""
        return by_ns_group(self.computed_by(self.rank))

    @property
    def nbytes(self) -> int:
        return self.group_size * sum(m.slot for m in self.members) * self.args.compute_dtype.itemsize

    def collectives(self) -> list[tuple]:
        """The bucket's collectives as ``(kind, group, sizes)``: the same on every rank."""
        if self.strategy is Strategy.ALL_GATHER:
            return [("all_gather_into_tensor", self.group_name, sum(m.slot for m in self.members))]
        sizes = self.split_sizes()
        return [
            ("all_to_all_single", self.group_name, tuple(sizes)),
            ("all_to_all_single", self.group_name, tuple(sizes)),
        ]


@dataclasses.dataclass(frozen=True)
class DistPlan:
    buckets: tuple[DistBucket, ...]
    skipped: tuple[tuple[int, str], ...]
    flops_per_rank: dict[str, tuple[int, ...]]

    def describe(self) -> str:
        """Buckets with their members' shapes and owners, then each rank's NS FLOPs."""
        lines = []
        for i, b in enumerate(self.buckets):
            members = ", ".join(m.describe() for m in b.members)
            lines.append(
                f"dist bucket {i}: {b.strategy.value} on group {b.group_name!r} (W={b.group_size}), "
                f"{b.nbytes / 2**20:.2f} MiB: {members}"
            )
        for group, flops in self.flops_per_rank.items():
            total = sum(flops)
            share = ", ".join(f"{f / 1e9:.3f}" for f in flops)
            lines.append(f"group {group!r} NS GFLOP per rank: [{share}] (total {total / 1e9:.3f})")
        lines += [f"sharded site {s} not distributed: {reason}" for s, reason in self.skipped]
        return "\n".join(lines)


def _dist_member(site: NSSite, owner: int) -> DistMember:
    block = site.sharding.block
    return DistMember(site.index, site.sharding.layout, block.nrows, block.ncols, owner, site.args.steps, site.batch, site.dims == 3)


def _strategy(site: NSSite, strategy: Strategy) -> Strategy:
    """``strategy``, but every rank computes a matrix of the ``duplicated`` tensor-parallel mode."""
    return Strategy.ALL_GATHER if site.sharding.layout.tp_mode == TPMode.DUPLICATED.value else strategy


def plan_distributed(sites: list[NSSite], *, bucket_mb: float, strategy: Strategy) -> DistPlan:
    """Plan the buckets and owners of the sharded ``sites`` (see the module docstring)."""
    sharded = [s for s in sites if s.sharding is not None]
    skipped = tuple((s.index, s.skip_reason) for s in sharded if s.skip_reason is not None)
    by_key: dict[tuple, list[NSSite]] = defaultdict(list)
    for s in sharded:
        if s.skip_reason is None:
            by_key[(s.sharding.group_name, s.sharding.group_size, s.args, s.level, _strategy(s, strategy))].append(s)
    runs = []
    for (group, world, args, _level, _strategy_of_run), group_sites in by_key.items():
        itemsize = args.compute_dtype.itemsize
        cap = bucket_mb * 2**20
        run: list[NSSite] = []
        size = 0
        for s in group_sites:
            nbytes = world * s.batch * s.sharding.layout.rows_per_shard * s.sharding.layout.cols_per_shard * itemsize
            if run and size + nbytes > cap:
                runs.append(run)
                run, size = [], 0
            run.append(s)
            size += nbytes
        runs.append(run)
    runs.sort(key=lambda r: r[0].index)
    loads: dict[str, list[int]] = {}
    buckets = []
    for run in runs:
        first = run[0].sharding
        run_strategy = _strategy(run[0], strategy)
        load = loads.setdefault(first.group_name, [0] * first.group_size)
        owners = {}
        for s in sorted(run, key=lambda s: (-s.batch * ns_flops(s.rows, s.cols, s.args.steps), s.index)):
            if run_strategy is Strategy.ALL_GATHER:
                owners[s.index] = EVERY_RANK
                for r in range(first.group_size):
                    load[r] += s.batch * ns_flops(s.rows, s.cols, s.args.steps)
            else:
                owner = min(range(first.group_size), key=lambda r: (load[r], r))
                owners[s.index] = owner
                load[owner] += s.batch * ns_flops(s.rows, s.cols, s.args.steps)
        members = tuple(_dist_member(s, owners[s.index]) for s in run)
        buckets.append(DistBucket(first.group_name, first.group_size, first.rank, run_strategy, run[0].args, members))
    return DistPlan(tuple(buckets), skipped, {g: tuple(v) for g, v in loads.items()})

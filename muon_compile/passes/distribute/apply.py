"""distribute: replace the sharded sites of each planned bucket by one collective layout.

Algorithm, per bucket (``all_to_all``, owner-compute):
  1. launch: cast every member's local shard to the compute dtype (Newton–Schulz's own
     first step, so the wire carries bf16), zero-pad it to ``rows_per_shard`` rows,
     flatten, concatenate by owner; one ``all_to_all_single`` (split sizes: the elements
     each owner owns, the same on every rank).
  2. compute: wait; the received ``[W, mine]`` block holds every rank's shard of each
     matrix this rank owns: reassemble each NS group's ``[n, W * rows_per_shard, cols]``,
     trimmed to the global rows, one block per layout (:func:`_received_groups`),
     orthogonalise (one batched NS per canonical shape), pad each layout's results back
     to ``W * rows_per_shard`` rows, permute them to ``[W, n, rows_per_shard, cols]``
     and concatenate the layouts along the slots (:func:`_scatter_rows`, the mirror of
     the reassembly); a second ``all_to_all_single`` returns every rank its rows.
  3. finish: wait; cut out each member's rows, drop the padding, cast to the shard's
     dtype: the old op node's users take that.
  ``all_gather``: launch packs every member and all-gathers the bucket; compute waits,
  reassembles and orthogonalises every matrix and keeps this rank's rows (no finish).
  All stages go after the last input of all buckets, in bucket order, each node tagged
  with its :class:`~.stages.StageTag` for the ``schedule`` pass.

Before / after (W = 2, two members, both owned by rank 0)::

    y0 = sharded_ns(x0, 24, "0", 2, ...)     # x0: 12x16 shard of 24x16
    y1 = sharded_ns(x1, 3, "0", 2, ...)      # x1: 2x16 shard of 3x16 (rank 1 holds 1 row)
 -> s  = all_to_all_single(cat([x0.bf16().flatten(), pad(x1.bf16(), 2).flatten()]), [224, 224], [224, 0])
    g  = wait(s).view(2, 224)     # every rank's shards of x0 and x1, side by side
    z0 = g[:, :192].view(2, 1, 12, 16).permute(1, 0, 2, 3).reshape(1, 24, 16)
    z1 = g[:, 192:].view(2, 1, 2, 16).permute(1, 0, 2, 3).reshape(1, 4, 16)[:, :3]; ns(z0); ns(z1)
    r  = all_to_all_single(cat([y0.view(1, 2, 12, 16).permute(1, 0, 2, 3).reshape(2, 192),
                                pad(y1, 4).view(1, 2, 2, 16).permute(1, 0, 2, 3).reshape(2, 32)], dim=1).flatten(), [224, 0], [224, 224])
    y0 = wait(r)[0:192].view(12, 16).float(); y1 = wait(r)[192:224].view(2, 16)[:2].float()
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence

import torch
import torch.fx as fx
from torch import Tensor

from muon_compile.config import Strategy
from muon_compile.diagnostics.counters import counters
from muon_compile.distributed.sharded_op import assemble, disassemble, own_block, pad, pad_block
from muon_compile.ns.args import NSArgs
from muon_compile.ns.op import newton_schulz_op

from ..graph_utils import splice_trace, stable_topological_sort
from .plan import DistBucket, DistMember, DistPlan
from .stages import Stage, StageTag, tagged

log = logging.getLogger(__name__)

_c10d = torch.ops._c10d_functional


def _pad_rows(t: Tensor, rows: int) -> Tensor:
    """``t``, a matrix or a stack of them, zero-padded to ``rows`` rows."""
    return pad(t, rows, t.size(-1))


def _count(members: Sequence[DistMember]) -> int:
    """The matrices of ``members`` (a stack's count for each of its members)."""
    return sum(m.batch for m in members)


def _layout_runs(members: Sequence[DistMember]) -> list[list[DistMember]]:
    """``members`` cut into runs of one layout, in order: the blocks that the reassembly
    (:func:`_received_groups`) and the cut-back (:func:`_scatter_rows`) move as one."""
    return [list(run) for _, run in itertools.groupby(members, key=lambda m: m.layout)]


def _scatter_rows(groups: Sequence[tuple[Sequence[DistMember], Tensor]], world: int) -> Tensor:
    """The flat ``[W, elements]`` buffer that sends rank j rows ``j * rows_per_shard`` onward
    of every result, padded, its slots in the order of the ``groups``' members (the
    transport order): the mirror of :func:`_received_groups`. ``groups``: each NS group's
    members and their stacked canonical results (:func:`_orthogonalize_stacked`).

    The members of one layout are one block: their ``[n, rows, cols]`` results, padded to
    ``W * rows_per_shard`` rows, viewed as ``[n, W, rows_per_shard, cols]`` and permuted
    to ``[W, n, rows_per_shard, cols]``; the blocks are concatenated along the slots.

    A tall layout's results are first transposed into a padded buffer of their own, by a
    concatenation with the padding rows: Inductor writes a concatenation's inputs in their
    own shape, so that is a tiled transposition; padded in the concatenation along the
    slots instead, the transposition is read through the flattened slot index, a division
    and a modulo per element in a scalar loop (a 12.6 ms kernel per ``gpt-small`` step at
    world 2). The padding rows are a result row times 0, not constant zeros: Inductor
    computes a constant with the step's first kernel, and the concatenation's buffer
    would then be held from the step's start (5 MiB more per rank with 4 MiB buckets).
    They are never read back. (Measured with the lab kept at tag
    ``costmodel-lab-2026-11-28``.)"""
    blocks = []
    for members, ortho in groups:
        start = 0
        for run in _layout_runs(members):
            m, n = run[0], _count(run)
            ys, rows = ortho[start : start + n], world * m.rows_per_shard
            if not m.shard.is_row_chunks:  # blocks of rows and columns: cut by their stretches
                blocks.append(disassemble(ys.mT if m.rows > m.cols else ys, m.shard).reshape(world, n * m.rows_per_shard * m.cols_per_shard))
                start += n
                continue
            if m.rows > m.cols:
                ys = ys.mT
                padding = ys[:, :1].mul(0).expand(n, rows - m.rows + 1, m.cols)
                ys = torch.cat([ys, padding], dim=1)[:, :rows]
            else:
                ys = _pad_rows(ys, rows)
            blocks.append(ys.reshape(n, world, m.rows_per_shard, m.cols).permute(1, 0, 2, 3).reshape(world, n * m.rows_per_shard * m.cols_per_shard))
            start += n
    return (blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)).reshape(-1)


def _orthogonalize_stacked(groups: Sequence[tuple[Sequence[DistMember], Tensor]], args: NSArgs) -> list[tuple[Sequence[DistMember], Tensor]]:
    """Each ``(members, stacked)`` group's members and their stacked canonical results: one
    batched NS call per group."""
    return [(members, newton_schulz_op(stacked, args)) for members, stacked in groups]


def _by_member(groups: Sequence[tuple[Sequence[DistMember], Tensor]]) -> dict[int, Tensor]:
    """Each member's result of :func:`_orthogonalize_stacked`'s ``groups``, by site, in the
    member's own orientation (a tall member's canonical result transposed back)."""
    out = {}
    for members, ortho in groups:
        start = 0
        for m in members:
            y = ortho[start : start + m.batch] if m.stacked else ortho[start]
            out[m.site] = y.mT if m.rows > m.cols else y
            start += m.batch
    return out


def _received_groups(grid: Tensor, order: Sequence[DistMember]) -> list[tuple[list[DistMember], Tensor]]:
    """Every NS group's members and stacked input, from the received ``[W, elements]`` grid
    (all-gathered, or this owner's part of an all-to-all) whose slots lie in ``order``
    (:meth:`DistBucket.owner_order`: by NS group, then by layout).

    The members of one layout are one ``[W, n, rows_per_shard, cols]`` block: permuted to
    ``[n, W, rows_per_shard, cols]``, reshaped and trimmed, the n whole matrices, transposed
    together if tall; a group of two layouts (a matrix and its transpose's shape) is their
    concatenation. Inductor's C++ code reads the block in a vectorised loop. A reshape per
    matrix, stacked, merges the world and row dimensions in each matrix's index, and is read
    with a division and a modulo per element in a scalar loop (six 1536x384 matrices at
    world 2: 6.5 ms against 1.6, ``scripts/bench_reassembly.py`` at tag
    ``costmodel-lab-2026-11-28``).
    """
    world = grid.size(0)
    groups: dict[tuple[int, int], tuple[list[DistMember], list[Tensor]]] = {}
    offset = 0
    for run in _layout_runs(order):
        m, n = run[0], _count(run)
        size = sum(r.slot for r in run)
        whole = assemble(grid[:, offset : offset + size].view(world, n, m.rows_per_shard, m.cols_per_shard), m.shard)
        members, parts = groups.setdefault(m.canonical, ([], []))
        members.extend(run)
        parts.append(whole.mT if m.rows > m.cols else whole)
        offset += size
    return [(members, parts[0] if len(parts) == 1 else torch.cat(parts)) for members, parts in groups.values()]


def _stages(bucket: DistBucket, dtypes: Sequence[torch.dtype]) -> list[tuple[Stage, Callable]]:
    """The traced stages of one bucket: ``[(name, fn)]``, each fn taking the previous one's outputs."""
    world, rank, group = bucket.group_size, bucket.rank, bucket.group_name
    cast = bucket.args.compute_dtype
    order = bucket.owner_order()
    position = {m.site: i for i, m in enumerate(bucket.members)}
    dtype = {m.site: d for m, d in zip(bucket.members, dtypes)}

    def pack(shards: Sequence[Tensor]) -> Tensor:
        return torch.cat([pad_block(shards[position[m.site]].to(cast), m.shard).reshape(-1) for m in order])

    if bucket.strategy is Strategy.ALL_GATHER:
        total = sum(m.slot for m in bucket.members)

        def launch(*shards: Tensor) -> list[Tensor]:
            return [_c10d.all_gather_into_tensor(pack(shards), world, group)]

        def gather_compute(gathered: Tensor) -> list[Tensor]:
            groups = _received_groups(_c10d.wait_tensor(gathered).view(world, total), order)
            result = _by_member(_orthogonalize_stacked(groups, bucket.args))
            return [own_block(result[m.site], m.shard, rank).to(dtype[m.site]) for m in bucket.members]

        return [(Stage.LAUNCH, launch), (Stage.COMPUTE, gather_compute)]

    sizes = bucket.split_sizes()
    mine = sizes[rank]
    owned = [m for m in order if m.owner == rank]  # in transport order

    def launch(*shards: Tensor) -> list[Tensor]:
        return [_c10d.all_to_all_single(pack(shards), [mine] * world, sizes, group)]

    def compute(received: Tensor) -> list[Tensor]:
        flat = _c10d.wait_tensor(received)
        if not owned:  # nothing to orthogonalise here: return the (empty) receive buffer
            return [_c10d.all_to_all_single(flat, sizes, [mine] * world, group)]
        result = _orthogonalize_stacked(_received_groups(flat.view(world, mine), owned), bucket.args)
        return [_c10d.all_to_all_single(_scatter_rows(result, world), sizes, [mine] * world, group)]

    def finish(returned: Tensor) -> list[Tensor]:
        flat = _c10d.wait_tensor(returned)
        rows, offset = {}, 0
        for m in order:
            shape = (m.batch, m.rows_per_shard, m.cols_per_shard) if m.stacked else (m.rows_per_shard, m.cols_per_shard)
            block = flat[offset : offset + m.slot].view(shape)
            block = block[:, : m.local_rows] if m.stacked else block[: m.local_rows]
            rows[m.site] = block if m.local_cols == m.cols_per_shard else block[..., : m.local_cols]
            offset += m.slot
        return [rows[m.site].to(dtype[m.site]) for m in bucket.members]

    return [(Stage.LAUNCH, launch), (Stage.COMPUTE, compute), (Stage.FINISH, finish)]


def apply_distribution(graph: fx.Graph, nodes: list[fx.Node], plan: DistPlan) -> None:
    """Rewrite every planned bucket of sharded sites (see the module docstring)."""
    if not plan.buckets:
        return
    order = {n: i for i, n in enumerate(graph.nodes)}
    inputs = [nodes[m.site].args[0] for b in plan.buckets for m in b.members]
    anchor = max(inputs, key=order.__getitem__).next
    for i, bucket in enumerate(plan.buckets):
        sites = [nodes[m.site] for m in bucket.members]
        values: list[fx.Node] = [n.args[0] for n in sites]
        dtypes = [n.args[0].meta["val"].dtype for n in sites]
        for stage, fn in _stages(bucket, dtypes):
            values = splice_trace(graph, fn, values, insert_before=anchor, meta=tagged(StageTag(i, stage)))
        for old, new in zip(sites, values):
            old.replace_all_uses_with(new)
            graph.erase_node(old)
        log.debug("distributed bucket %d: %s, %d matrices", i, bucket.strategy.value, len(bucket.members))
        counters["distribute.buckets"] += 1
        counters["distribute.matrices"] += len(bucket.members)
        counters["distribute.collectives"] += len(bucket.collectives())
    for site, reason in plan.skipped:
        log.debug("sharded site %d left per matrix: %s", site, reason)
        counters["distribute.skipped"] += 1
    stable_topological_sort(graph)

"""schedule: order the distributed buckets' stages so communication overlaps compute.

Algorithm:
  1. Collect the nodes of each ``(bucket, stage)`` that ``distribute`` tagged, in graph order.
  2. Plan the stage order for ``prefetch`` k (:func:`stage_order`): launch buckets
     0..k-1 first; then for each bucket i: launch i+k, compute i, finish i-1; finally
     finish the last bucket. Bucket i+k's collective is thus issued before bucket i's
     Newton–Schulz, and bucket i-1's return trip runs during it; every stage starts with
     the wait of its collective, so each wait sits just before its first use. k = 0
     runs the buckets one after another.
  3. Move the stage groups into that order at the place of the first tagged node,
     keeping each group's internal order, then re-sort topologically (a bucket fed by
     another bucket's result stays after it). The order is the same on every rank.

Before / after (k = 1, three all_to_all buckets)::

    L0 C0 F0 L1 C1 F1 L2 C2 F2  ->  L0 L1 C0 L2 C1 F0 C2 F1 F2
"""

from __future__ import annotations

import logging
from collections import defaultdict

import torch.fx as fx

from muon_compile.diagnostics.counters import counters

from .distribute.stages import Stage, StageTag, stage_of
from .graph_utils import stable_topological_sort

log = logging.getLogger(__name__)


def stage_order(buckets: int, finish: bool, prefetch: int) -> list[StageTag]:
    """The stage sequence for ``buckets`` buckets (see the module docstring)."""
    launch, compute, end = Stage.LAUNCH, Stage.COMPUTE, Stage.FINISH
    if prefetch <= 0:
        stages = [launch, compute, end] if finish else [launch, compute]
        return [StageTag(b, stage) for b in range(buckets) for stage in stages]
    order = [StageTag(b, launch) for b in range(min(prefetch, buckets))]
    for b in range(buckets):
        if b + prefetch < buckets:
            order.append(StageTag(b + prefetch, launch))
        order.append(StageTag(b, compute))
        if finish and b >= 1:
            order.append(StageTag(b - 1, end))
    if finish and buckets:
        order.append(StageTag(buckets - 1, end))
    return order


def apply_schedule(graph: fx.Graph, prefetch: int) -> None:
    """Reorder the tagged stage nodes of ``graph`` for ``prefetch`` (see the module docstring)."""
    groups: dict[StageTag, list[fx.Node]] = defaultdict(list)
    for node in graph.nodes:
        tag = stage_of(node)
        if tag is not None:
            groups[tag].append(node)
    if not groups:
        return
    buckets = 1 + max(tag.bucket for tag in groups)
    finish = any(tag.stage is Stage.FINISH for tag in groups)
    order = [tag for tag in stage_order(buckets, finish, prefetch) if tag in groups]
    first = next(n for n in graph.nodes if stage_of(n) is not None)
    cursor = first.prev
    for tag in order:
        for node in groups[tag]:
            cursor.append(node)
            cursor = node
    stable_topological_sort(graph)
    log.debug("scheduled %d buckets with prefetch %d: %s", buckets, prefetch, ", ".join(map(str, order)))
    counters["schedule.buckets"] += buckets

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

from muon_compile.stats import counters

from .distribute import COMPUTE, FINISH, LAUNCH
from .graph_utils import STAGE_META, stable_topological_sort

log = logging.getLogger(__name__)


def stage_order(buckets: int, finish: bool, prefetch: int) -> list[tuple[int, str]]:
    """The ``(bucket, stage)`` sequence for ``buckets`` buckets (see the module docstring)."""
    if prefetch <= 0:
        tail = [FINISH] if finish else []
        return [(b, stage) for b in range(buckets) for stage in [LAUNCH, COMPUTE, *tail]]
    order = [(b, LAUNCH) for b in range(min(prefetch, buckets))]
    for b in range(buckets):
        if b + prefetch < buckets:
            order.append((b + prefetch, LAUNCH))
        order.append((b, COMPUTE))
        if finish and b >= 1:
            order.append((b - 1, FINISH))
    if finish and buckets:
        order.append((buckets - 1, FINISH))
    return order


def apply_schedule(graph: fx.Graph, prefetch: int) -> None:
    """Reorder the tagged stage nodes of ``graph`` for ``prefetch`` (see the module docstring)."""
    groups: dict[tuple[int, str], list[fx.Node]] = defaultdict(list)
    for node in graph.nodes:
        if STAGE_META in node.meta:
            groups[node.meta[STAGE_META]].append(node)
    if not groups:
        return
    buckets = 1 + max(b for b, _ in groups)
    finish = any(stage == FINISH for _, stage in groups)
    order = [key for key in stage_order(buckets, finish, prefetch) if key in groups]
    first = next(n for n in graph.nodes if STAGE_META in n.meta)
    cursor = first.prev
    for key in order:
        for node in groups[key]:
            cursor.append(node)
            cursor = node
    stable_topological_sort(graph)
    log.debug("scheduled %d buckets with prefetch %d: %s", buckets, prefetch, order)
    counters["schedule.buckets"] += buckets

"""find: describe every Newton–Schulz op node of a post-grad graph as plain data.

Algorithm:
  1. Collect the ``muon_compile::newton_schulz`` and ``sharded_newton_schulz`` nodes in
     graph order. A sharded node is in every rank's graph (it is side-effecting), so the
     sharded sites are the same, in the same order, on every rank.
  2. For each, read the input's fake value (batch, rows, cols, dtype, device) and the
     op's :class:`~muon_compile.ns.args.NSArgs` into an :class:`NSSite`; a sharded site
     also records its layout over its process group (the global shape, where each rank's
     block sits) and this rank's place in the group.
  3. Record each site's level: the most NS ops on any path into its input. Sites of one
     level never depend on each other, so they may share a bucket.
  4. Mark a site as not bucketable, with its reason, when its shape is symbolic or its
     result escapes as a graph output (stacking would make outputs alias each other).

Before / after: the graph is unchanged; ``[ns(x0, ...), ns(x1, ...)]`` becomes
``[NSSite(0, 1, 48, 16, ...), NSSite(1, 1, 16, 16, ...)]``.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from muon_compile.distributed.sharded_op import Block, ShardLayout, group_rank
from muon_compile.ns.args import NSArgs

from .graph_utils import NS_TARGETS, TORCH_NS_TARGETS, escapes_to_output, ns_call, ns_nodes


@dataclasses.dataclass(frozen=True)
class Sharding:
    """A sharded site's layout over its process group and this rank's place in the group."""

    layout: ShardLayout
    rank: int

    @property
    def group_name(self) -> str:
        return self.layout.group_name

    @property
    def group_size(self) -> int:
        return self.layout.group_size

    @property
    def block(self) -> Block | None:
        """This rank's block of the matrix (None where a size is symbolic)."""
        return self.layout.block(self.rank) if self.layout.concrete else None


@dataclasses.dataclass(frozen=True)
class NSSite:
    """One NS op call: ``batch`` matrices of ``rows x cols`` (batch is 1 for a 2-D input).

    For a sharded site ``rows`` and ``cols`` are the whole matrix's (``batch``: the matrices
    of this rank's stack) and ``sharding`` says where this rank's block is; for a plain site
    ``sharding`` is None.
    """

    index: int
    batch: int
    rows: int
    cols: int
    dims: int
    dtype: torch.dtype
    device: str
    args: NSArgs
    level: int = 0
    skip_reason: str | None = None
    sharding: Sharding | None = None

    @property
    def symbolic(self) -> bool:
        """Whether the shape is symbolic (Dynamo's dynamic shapes): ``batch``, ``rows`` or ``cols`` is then -1."""
        return -1 in (self.batch, self.rows, self.cols)


def _levels(graph: fx.Graph, targets: tuple) -> dict[fx.Node, int]:
    """Per node, the most NS calls (of ``targets``) on a path ending at it (the node itself included)."""
    level: dict[fx.Node, int] = {}
    for node in graph.nodes:
        inherited = max((level[n] for n in node.all_input_nodes), default=0)
        level[node] = inherited + (node.target in targets)
    return level


def _site(index: int, node: fx.Node, level: int, meta_key: str) -> NSSite:
    call = ns_call(node)
    x = call.input.meta[meta_key]
    shape = tuple(x.shape)
    sharding = None
    if call.shard is not None:
        sharding = Sharding(call.shard, group_rank(call.shard.group_name))
        shape = (*shape[:-2], call.shard.rows, call.shard.cols)  # a stack's local count of matrices, the global matrix
    reason = None
    if not all(isinstance(d, int) for d in shape):
        # "?" for a symbol: symbols are named per process, and the ranks compare plans
        reason = f"symbolic shape ({', '.join(str(d) if isinstance(d, int) else '?' for d in shape)})"
    elif escapes_to_output(node):
        reason = "result is a graph output"
    batch = shape[0] if len(shape) == 3 else 1
    return NSSite(
        index=index,
        batch=batch if isinstance(batch, int) else -1,
        rows=shape[-2] if isinstance(shape[-2], int) else -1,
        cols=shape[-1] if isinstance(shape[-1], int) else -1,
        dims=len(shape),
        dtype=x.dtype,
        device=str(x.device),
        args=call.args,
        level=level,
        skip_reason=reason,
        sharding=sharding,
    )


def find_ns_sites(graph: fx.Graph, *, torch_level: bool = False) -> tuple[list[fx.Node], list[NSSite]]:
    """The NS nodes in graph order and their descriptions (``sites[i].index == i``).

    ``torch_level``: ``graph`` is a Dynamo graph after ``canonicalize`` (fake values in
    ``meta["example_value"]``, DTensors not yet desugared, routed calls described by
    their DTensor's layout): the sites the post-grad graph will hold, as every rank
    plans them before compiling (:mod:`fingerprint`).
    """
    targets = TORCH_NS_TARGETS if torch_level else NS_TARGETS
    nodes = ns_nodes(graph, targets)
    levels = _levels(graph, targets) if nodes else {}
    meta_key = "example_value" if torch_level else "val"
    return nodes, [_site(i, n, levels[ns_call(n).input], meta_key) for i, n in enumerate(nodes)]

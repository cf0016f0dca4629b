"""bucket: rewrite each planned bucket into one batched Newton–Schulz call.

Algorithm:
  1. For each bucket that changes the graph (several members, or padding), trace
     ``stack -> newton_schulz(3-D) -> unstack`` over its members' inputs: each member is
     cast to the compute dtype (the op's own first step), a tall one enters transposed,
     a smaller one zero-padded; each output is a slice of the batch result, transposed
     back and cast to its input's dtype, left for Inductor to fuse with the momentum that
     produces the inputs and the update that consumes the outputs.
  2. Splice the trace in after the last member input, point every member's users at
     its new output, erase the old NS nodes.
  3. Restore a topological order (users of an early member now follow the batch call);
     ``find`` keyed sites by NS depth, so no bucket feeds itself.

Before / after::

    y0 = ns(x0)            # x0: 48x16 (tall), fp32
    y1 = ns(x1)            # x1: 16x48, fp32
 -> b  = cat([x0.bf16().mT[None], x1.bf16()[None]]); yb = ns(b)    # 2 x 16x48, bf16
    y0 = yb[0].mT.float(); y1 = yb[1].float()
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F

from muon_compile.diagnostics.counters import counters
from muon_compile.ns.op import newton_schulz_op

from ..graph_utils import splice_trace, stable_topological_sort
from .plan import Bucket, BucketPlan

log = logging.getLogger(__name__)


def stack_members(xs: Sequence[torch.Tensor], bucket: Bucket) -> torch.Tensor:
    """Members' matrices as one ``[matrices, rows, cols]`` batch in the compute dtype
    (transposed, zero-padded): the op casts first, so this is exact."""
    blocks = []
    for x, m in zip(xs, bucket.members):
        block = (x if x.dim() == 3 else x.unsqueeze(0)).to(bucket.args.compute_dtype)
        if m.transpose:
            block = block.mT
        if (m.rows, m.cols) != (bucket.rows, bucket.cols):
            block = F.pad(block, (0, bucket.cols - m.cols, 0, bucket.rows - m.rows))
        blocks.append(block)
    return torch.cat(blocks)


def unstack_members(y: torch.Tensor, bucket: Bucket, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Inverse of :func:`stack_members`: each member's result, shaped and typed like its input."""
    outs = []
    offset = 0
    for m, x in zip(bucket.members, like):
        block = y[offset : offset + m.batch, : m.rows, : m.cols]
        offset += m.batch
        if m.transpose:
            block = block.mT
        outs.append((block if x.dim() == 3 else block.squeeze(0)).to(x.dtype))
    return outs


def _rewrite(graph: fx.Graph, nodes: list[fx.Node], bucket: Bucket) -> None:
    members = [nodes[m.site] for m in bucket.members]
    inputs = [n.args[0] for n in members]
    def batched(*xs: torch.Tensor) -> list[torch.Tensor]:
        y = newton_schulz_op(stack_members(xs, bucket), bucket.args)
        return unstack_members(y, bucket, xs)

    order = {n: i for i, n in enumerate(graph.nodes)}
    last_input = max(inputs, key=order.__getitem__)
    outputs = splice_trace(graph, batched, inputs, insert_before=last_input.next)
    for old, new in zip(members, outputs):
        old.replace_all_uses_with(new)
        graph.erase_node(old)
    stable_topological_sort(graph)


def apply_buckets(graph: fx.Graph, nodes: list[fx.Node], plan: BucketPlan) -> None:
    """Rewrite ``graph`` so each bucket of ``plan`` is one batched NS call (see module docstring)."""
    for i, bucket in enumerate(plan.buckets):
        log.debug(
            "bucket %d: %d matrices %dx%d from sites %s%s",
            i, bucket.matrices, bucket.rows, bucket.cols,
            [m.site for m in bucket.members], " (padded)" if bucket.padded else "",
        )
        counters["bucket.buckets"] += 1
        counters["bucket.matrices"] += bucket.matrices
        if bucket.padded:
            counters["bucket.padded_buckets"] += 1
        if bucket.rewrites:
            _rewrite(graph, nodes, bucket)
    for site, reason in plan.skipped:
        log.debug("site %d left unbucketed: %s", site, reason)
        counters["bucket.skipped"] += 1

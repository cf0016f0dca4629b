"""lower: replace every Newton–Schulz op node by its bmm + pointwise form.

Algorithm:
  1. For each ``muon_compile::newton_schulz`` node, trace the op's own pure kernel
     (:func:`muon_compile.ns.evaluate.orthogonalize`) on its input with Inductor's
     decompositions, with the algorithm ``plan_algorithms`` chose for the node, so the
     graph computes exactly what eager computes. A
     ``sharded_newton_schulz`` node that ``distribute`` left alone gets its own reference
     algorithm (all-gather, NS, slice) the same way.
  2. Splice the trace in place of the node. Inductor then calls extern bmm kernels and
     fuses the normalisation, casts and transposes with their neighbours (the stack and
     momentum before, the unstack and update after).

Before / after (one iteration shown)::

    y = ns(x, [a, b, c], 1, ...)
 -> xf = x.bf16().float(); x0 = (xf / (vector_norm(xf) + eps)).bf16()
    A = bmm(x0, x0.mT); B = (c * bmm(A, A) + b * A + a * I).bf16(); y = bmm(B, x0).float()
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import torch
import torch.fx as fx

from muon_compile.diagnostics.counters import counters
from muon_compile.distributed.sharded_op import gather_orthogonalize_slice, group_rank
from muon_compile.ns.args import TEXTBOOK
from muon_compile.ns.evaluate import orthogonalize

from ..distribute.stages import stage_of, tagged
from ..graph_utils import NSCall, ns_call, ns_nodes, splice_trace
from .plan import AlgorithmPlan

log = logging.getLogger(__name__)


def lower_ns_ops(graph: fx.Graph, plan: AlgorithmPlan) -> None:
    """Lower the NS op nodes of ``graph`` with the algorithms of ``plan`` (see the module
    docstring); a node the plan skipped (a symbolic shape) stays the op."""
    chosen = plan.by_node()
    for node in ns_nodes(graph):
        if node.name not in chosen:  # left as the op (plan.skipped)
            continue
        call = dataclasses.replace(ns_call(node), args=chosen[node.name].chosen_args)
        choice = chosen[node.name]
        products, epilogue, orientation = choice.products.kind, choice.epilogue.kind, choice.orientation.kind
        log.debug(
            "lowering %s on %s: %s, %s products, %s", node.name, tuple(call.input.meta["val"].shape), call.args.describe(), products, epilogue
        )
        counters[f"lower.{call.args.algorithm}"] += 1
        counters[f"lower.products_{products}"] += 1
        if call.args.algorithm == TEXTBOOK:
            counters[f"lower.scalars_in_{epilogue}"] += 1
        kernel = _kernel(call, products, epilogue, orientation)
        (out,) = splice_trace(graph, kernel, [call.input], insert_before=node, meta=tagged(stage_of(node)))
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        counters["lower.ns_ops"] += 1


def _kernel(call: NSCall, products: str, epilogue: str, orientation: str) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    """The pure function an NS node computes, closed over its non-tensor arguments."""
    if call.shard is not None:
        shard, rank = call.shard, group_rank(call.shard.group_name)
        return lambda t: [gather_orthogonalize_slice(t, shard, rank, call.args, products=products, epilogue=epilogue, orientation=orientation)]
    return lambda t: [orthogonalize(t, call.args, products=products, epilogue=epilogue, orientation=orientation)]

"""lower: replace every Newton–Schulz op node by its bmm + pointwise form.

Algorithm:
  1. For each ``muon_compile::newton_schulz`` node, trace the op's own pure kernel
     (:func:`muon_compile.ns_kernel.orthogonalize`) on its input with Inductor's
     decompositions, so the graph computes exactly what eager computes.
  2. Splice the trace in place of the node. Inductor then calls extern bmm kernels and
     fuses the normalisation, casts and transposes with their neighbours (the stack and
     momentum before, the unstack and update after).

Before / after (one iteration shown)::

    y = ns(x, [a, b, c], 1, ...)
 -> xf = x.bf16().float(); x0 = (xf / (vector_norm(xf) + eps)).bf16()
    A = bmm(x0, x0.mT); B = (c * bmm(A, A) + b * A + a * I).bf16(); y = bmm(B, x0).float()
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx

from muon_compile.coefficients import unflatten
from muon_compile.ns_kernel import orthogonalize
from muon_compile.stats import counters

from .graph_utils import ns_nodes, splice_trace

log = logging.getLogger(__name__)


def lower_ns_ops(graph: fx.Graph) -> None:
    """Lower all NS op nodes of ``graph`` (see the module docstring)."""
    for node in ns_nodes(graph):
        x, coefficients, steps, eps, norm_scale, clamp_eps, compute_dtype = node.args[:7]
        triples = unflatten(coefficients)

        def kernel(t: torch.Tensor) -> list[torch.Tensor]:
            return [orthogonalize(t, triples, steps, eps, norm_scale, clamp_eps, compute_dtype)]

        (out,) = splice_trace(graph, kernel, [x], insert_before=node)
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        log.debug("lowered %s on %s", node.name, tuple(x.meta["val"].shape))
        counters["lower.ns_ops"] += 1

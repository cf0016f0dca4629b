"""write_source: the stacked write reads the Newton–Schulz result as ``lower`` left it.

``muon_compile::unstack_scale_add_`` (the stacked step's write, :mod:`muon_compile.optim.stacks`)
computes in its members' dtype from a ``src`` of any float dtype and strides. After ``lower``
its ``src`` is the op's result as the step spelled it: the bf16 result of the last product,
transposed back or sliced out of a bucket, cast up to the parameters' fp32 and made
contiguous (``orthogonalize`` returns ``x``'s dtype and a contiguous tensor). Inductor would
write that fp32 copy (6 bytes a parameter) for the write to read again (4 more). Both steps
change no value the write computes (the cast up is exact, the copy only lays out), so the
write is handed what they start from.

Algorithm:
  1. Plan: for each write node (``auto_functionalized_v2`` of the op), follow ``src`` back
     through ``aten.clone`` and ``prims.convert_element_type`` to a float dtype that the
     target holds exactly (bf16 / fp16 to fp32, any to a wider one of its kind); the node
     reached, if not ``src`` itself, is the new source.
  2. Apply: replace ``src`` (and its value in ``meta["eager_input_vals"]``, by which Inductor
     lays out a custom op's inputs: with the old one it would copy a transposed source
     into the old layout); the steps left unused are erased.

Before / after::

    y = permute(B, [0, 2, 1]); f = convert_element_type(y, f32); c = clone(f)
    auto_functionalized_v2(unstack_scale_add_, ..., src=c, ...)
 -> auto_functionalized_v2(unstack_scale_add_, ..., src=y, ...)
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx
from torch._higher_order_ops.auto_functionalize import auto_functionalized_v2

from muon_compile.diagnostics.counters import counters
from muon_compile.optim.stacks import STACK_WRITE

_CLONE = torch.ops.aten.clone.default
_CONVERT = torch.ops.prims.convert_element_type.default


@dataclasses.dataclass(frozen=True)
class SourceSwap:
    """Write ``node`` reads ``source`` instead of its ``src`` (``skipped``: the casts and
    copies between them, last first)."""

    node: fx.Node
    source: fx.Node
    skipped: tuple[fx.Node, ...]


def plan_write_sources(graph: fx.Graph) -> list[SourceSwap]:
    """The writes whose ``src`` can be read before its exact casts and copies."""
    swaps = []
    for node in graph.find_nodes(op="call_function", target=auto_functionalized_v2):
        if node.args[0] is not STACK_WRITE or not isinstance(src := node.kwargs.get("src"), fx.Node):
            continue
        skipped = []
        current = src
        while (before := _undone(current)) is not None:
            skipped.append(current)
            current = before
        if skipped:
            swaps.append(SourceSwap(node, current, tuple(skipped)))
    return swaps


def apply_write_sources(graph: fx.Graph, swaps: list[SourceSwap]) -> None:
    """Hand each write its planned source and erase the steps nothing else reads."""
    for swap in swaps:
        swap.node.update_kwarg("src", swap.source)
        if eager := swap.node.meta.get("eager_input_vals"):
            # Inductor lays a custom op's inputs out as these say: the source's own strides
            args, kwargs = eager
            swap.node.meta["eager_input_vals"] = (args, {**kwargs, "src": swap.source.meta["val"]})
        for step in swap.skipped:
            if not step.users:
                graph.erase_node(step)
        counters["write_source.swapped"] += 1


def _undone(node: fx.Node) -> fx.Node | None:
    """The input of ``node`` if ``node`` is a contiguous clone or an exact cast up of a float
    tensor; None otherwise."""
    if node.op != "call_function" or not isinstance(node.args[0], fx.Node):
        return None
    if node.target is _CLONE and set(node.kwargs) <= {"memory_format"}:
        return node.args[0]
    if node.target is _CONVERT and exact_cast_up(node.args[0].meta["val"].dtype, node.args[1]):
        return node.args[0]
    return None


def exact_cast_up(source: torch.dtype, target: torch.dtype) -> bool:
    """Whether every value of float dtype ``source`` is one of ``target``."""
    if not (source.is_floating_point and target.is_floating_point):
        return False
    s, t = torch.finfo(source), torch.finfo(target)  # fewer digits, a range inside the target's
    return s.eps >= t.eps and s.smallest_normal >= t.smallest_normal and s.max <= t.max

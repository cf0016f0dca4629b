"""Spare Dynamo a second trace of every step that reads 0-D float64 CPU tensors.

Dynamo gives each 0-D float64 (or integer) CPU tensor input a symbolic value for a
``.item()`` that may come (``FakeTensorConverter.from_real_tensor``: the tensor's
``item_memo``). AOTAutograd's ``tensorify_python_scalars`` pass then finds that symbol
neither turned into a tensor nor specialised, marks it specialised and restarts Dynamo's
analysis of the whole frame (``TensorifyScalarRestartAnalysis``; torch 2.11 – 2.15). When
no ``.item()`` was taken, the second trace gives the same graph: it only re-runs Dynamo and
this backend's passes. This package's optimizers keep their hyper-parameters as such
tensors (float64, as exact as a Python float), so each first compile traced twice: 0.6 –
0.9 s of a 5 – 10 s first step for 24 matrices on the 2-core VM.

:func:`mark_unused_items` marks, before AOTAutograd runs, the symbols of inputs whose
``.item()`` the graph never took as specialised, as the restart itself would (the name
``TensorifyState.specialize`` is given, then read by the pass); any symbol the graph uses is
left to the pass. Where the internals differ (another torch), nothing is marked, and the
restart happens as before.
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx

log = logging.getLogger(__name__)


def mark_unused_items(gm: fx.GraphModule) -> int:
    """Mark the ``.item()`` symbols of ``gm``'s (a Dynamo graph's) 0-D inputs that nothing in
    the graph uses as specialised (see the module docstring); the number marked."""
    try:
        from torch._dynamo.symbolic_convert import TensorifyState
    except ImportError:  # another torch: the restart, as before
        return 0
    used: set = set()
    candidates = {}
    for node in gm.graph.nodes:
        value = node.meta.get("example_value")
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            used |= value.node.expr.free_symbols
        if node.op != "placeholder" or not isinstance(value, torch.Tensor):
            continue
        memo = getattr(value, "item_memo", None)
        symbol = getattr(getattr(memo, "node", None), "_expr", None)
        if isinstance(memo, torch.SymFloat) and hasattr(symbol, "name") and node.users:
            if all(user.target != "item" for user in node.users):
                candidates[symbol] = node
    marked = 0
    for symbol in candidates:
        if symbol not in used and not TensorifyState.should_specialize(symbol.name):
            TensorifyState.specialize(symbol.name)
            marked += 1
    if marked:
        log.debug("marked %d unused .item() symbol(s) of 0-D float inputs specialised", marked)
    return marked

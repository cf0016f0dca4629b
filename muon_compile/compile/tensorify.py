"""Python scalars in a compiled step: spare Dynamo a second trace of every step that reads
0-D float64 CPU tensors, and keep AOTAutograd's cache from a stale learning rate.

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

:func:`float_inputs`: torch 2.13's AOTAutograd cache served a stale learning rate to
unmodified ``torch.optim.Muon`` with weight decay under a scheduler (a Python float ``lr``):
on the recompile that makes ``lr`` a symbolic input, the cached graph kept a value and the
step stopped recompiling, so every later step used it (12 steps of ``CosineAnnealingLR``:
2 graphs, the parameters 0.088 away from eager's; with the cache off, or on torch 2.11 and
2.15, 8 graphs and eager's values). The backend compiles a graph with symbolic float
inputs without that cache (the FX graph cache still serves its kernels).

:func:`alpha_as_product`: a symbolic float given as ``alpha=`` (``p.add_(u, alpha=-lr)``,
as ``torch.optim.Muon`` writes its update) cannot become a tensor (``alpha`` is a Scalar
argument), so AOTAutograd specialises it and every new learning rate recompiles the step
(8 graphs in 12 scheduled steps, then eager). Written as ``p.add_(u.to(dtype) * -lr)``
(``dtype`` the sum's: ``alpha`` scales ``u`` there, so a bf16 ``u`` is not rounded to bf16
again after the product, as ``u * -lr`` would be), the float becomes a graph input and the
step compiles twice: once with the first value, once symbolic.
"""

from __future__ import annotations

import logging
import operator

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


def float_inputs(gm: fx.GraphModule) -> list[str]:
    """The names of ``gm``'s (a Dynamo graph's) symbolic Python-float inputs: a float
    placeholder, or the 0-D tensor Dynamo passes a float as (its ``.item()`` taken)."""
    return [
        node.name
        for node in gm.graph.find_nodes(op="placeholder")
        if isinstance(node.meta.get("example_value"), torch.SymFloat)
        or any(user.target == "item" for user in node.users)
    ]


_ALPHA_METHODS = {"add", "add_", "sub", "sub_"}
_ALPHA_FUNCTIONS = {torch.add, torch.sub, torch.Tensor.add, torch.Tensor.add_, torch.Tensor.sub, torch.Tensor.sub_}


def alpha_as_product(gm: fx.GraphModule) -> int:
    """Rewrite ``x.add_(y, alpha=s)`` (and ``add``, ``sub``, ``sub_``, as methods or
    functions) with a symbolic float ``s`` as ``x.add_(y * s)`` (see the module docstring);
    the number rewritten."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        method = node.op == "call_method" and node.target in _ALPHA_METHODS
        function = node.op == "call_function" and node.target in _ALPHA_FUNCTIONS
        alpha = node.kwargs.get("alpha")
        if not (method or function) or len(node.args) != 2 or not isinstance(alpha, fx.Node):
            continue
        other = node.args[1]
        alpha_value, other_value = alpha.meta.get("example_value"), getattr(other, "meta", {}).get("example_value")
        if not isinstance(alpha_value, torch.SymFloat) or not isinstance(other_value, torch.Tensor):
            continue
        x_value = getattr(node.args[0], "meta", {}).get("example_value")
        dtype = torch.result_type(x_value, other_value) if isinstance(x_value, torch.Tensor) else other_value.dtype
        try:
            with other_value.fake_mode:
                cast_value = other_value.to(dtype)
                product_value = cast_value * alpha_value
        except Exception:  # a value fake tensors cannot multiply: leave the node as it is
            continue
        with gm.graph.inserting_before(node):
            if dtype != other_value.dtype:  # the product in the sum's dtype, as alpha= is applied
                other = gm.graph.call_method("to", (other, dtype))
                other.meta = {**node.args[1].meta, "example_value": cast_value}
            product = gm.graph.call_function(operator.mul, (other, alpha))
        product.meta = {**other.meta, "example_value": product_value}
        node.args = (node.args[0], product)
        node.kwargs = {k: v for k, v in node.kwargs.items() if k != "alpha"}
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten

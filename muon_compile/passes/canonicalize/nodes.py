"""What a node of a Dynamo graph is, as :mod:`.walk` reads it: its operation under one name
whatever its spelling (:func:`node_kind`: ``torch.mm``, ``x @ y`` and ``x.bmm(y)`` are all
``"matmul"``; ``x.div_(n)`` is ``("div", True)``), its arguments (:func:`argument`), its
example value, and the questions the walk asks of one node alone (is it a cast, a read of
metadata only, a reduction over each matrix?). Nothing here knows the walk's values.
"""

from __future__ import annotations

import builtins
import operator
from typing import Any

import torch
import torch.fx as fx

from muon_compile.compile.compat import VIEW_ATTRIBUTE_OPS
from muon_compile.passes.fx_writes import storage_of as _storage

_FUNCTIONS = {
    operator.add: "add", torch.add: "add", operator.iadd: "add_",
    operator.sub: "sub", torch.sub: "sub", operator.isub: "sub_",
    operator.mul: "mul", torch.mul: "mul", operator.imul: "mul_",
    operator.truediv: "div", torch.div: "div", torch.true_divide: "div", operator.itruediv: "div_",
    operator.neg: "neg", torch.neg: "neg",
    operator.matmul: "matmul", torch.matmul: "matmul", torch.mm: "matmul", torch.bmm: "matmul",
    torch.addmm: "addmm", torch.baddbmm: "addmm",
    torch.transpose: "transpose", torch.swapaxes: "transpose", torch.swapdims: "transpose", torch.t: "t",
    torch.diagonal: "diagonal", torch.eye: "eye",
    torch.norm: "norm", torch.linalg.norm: "linalg_norm",
    torch.linalg.vector_norm: "vector_norm", torch.linalg.matrix_norm: "matrix_norm",
    torch.clamp: "clamp", torch.clamp_min: "clamp_min",
    torch.square: "square", torch.pow: "pow", operator.pow: "pow", torch.sum: "sum", torch.sqrt: "sqrt",
    torch.reciprocal: "reciprocal", torch.rsqrt: "rsqrt",
    torch.nn.functional.normalize: "normalize",
    torch.tensor: "tensor", torch.as_tensor: "tensor", torch.scalar_tensor: "tensor", operator.getitem: "getitem",
    torch.empty: "empty", torch.empty_like: "empty", torch.zeros: "empty", torch.zeros_like: "empty",
    builtins.getattr: "getattr",
    **VIEW_ATTRIBUTE_OPS,
}
_METHODS = {
    "mm": "matmul", "bmm": "matmul", "matmul": "matmul", "addmm": "addmm", "baddbmm": "addmm",
    "true_divide": "div", "swapaxes": "transpose", "swapdims": "transpose",
    "true_divide_": "div_", "addmm_": "addmm_", "baddbmm_": "addmm_",
}
CASTS = {"bfloat16": torch.bfloat16, "half": torch.float16, "float": torch.float32, "double": torch.float64}
_METADATA = ("size", "dim", "stride", "numel", "get_device", "is_contiguous")


def node_kind(node: fx.Node) -> tuple[str | None, bool]:
    """``(operation name, in_place)`` of a call node, e.g. ``("div", True)`` for ``x.div_(n)``."""
    if node.op == "call_function":
        name = _FUNCTIONS.get(node.target)
    elif node.op == "call_method":
        name = _METHODS.get(node.target, node.target)
    else:
        return None, False
    if name is None:
        return None, False
    if name.endswith("_"):
        return name[:-1], True
    return name, False


def default_diagonal(node: fx.Node) -> bool:
    """``X.diagonal()`` of the last two dimensions (any spelling of the default)."""
    offset = argument(node, 1, "offset", 0)
    dims = (argument(node, 2, "dim1", None), argument(node, 3, "dim2", None))
    rank = getattr(example_value(node.args[0]), "ndim", None)
    last_two = {(None, None), (-2, -1)} | ({(0, 1)} if rank == 2 else set()) | ({(rank - 2, rank - 1)} if rank else set())
    return offset == 0 and dims in last_two


def argument(node: fx.Node, index: int, key: str, default: Any = None) -> Any:
    """The argument at position ``index`` or keyword ``key`` of ``node``, else ``default``."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(key, default)


def example_value(node: Any) -> Any:
    """The fake tensor (or other value) Dynamo recorded for ``node``; None for a non-node."""
    return node.meta.get("example_value") if isinstance(node, fx.Node) else None


def same_layout(node: fx.Node, src: Any) -> bool:
    """Whether ``node`` is ``src``'s storage seen as ``src`` is: its dtype (not a ``view(dtype)``'s
    reinterpretation), shape, strides and offset."""
    a, b = example_value(node), example_value(src)
    return (
        isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _storage(node) == _storage(src)
        and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        and a.storage_offset() == b.storage_offset()
    )


def reads_metadata(node: fx.Node) -> bool:
    """``x.size()``, ``x.shape`` ...: reads no values, so it is no escape."""
    if node.op == "call_method":
        return node.target in _METADATA
    return node.target is builtins.getattr and not isinstance(example_value(node), torch.Tensor)


def literal(x: Any) -> bool:
    """A Python number, or a (nested) list / tuple of them: the arguments ``torch.tensor`` folds."""
    if isinstance(x, (list, tuple)):
        return all(literal(v) for v in x)
    return isinstance(x, (int, float, bool, torch.dtype)) or x is None


def per_matrix_problem(node: fx.Node, nd: int, dim: Any, keepdim: bool) -> str | None:
    """Why a reduction over ``dim`` of an ``nd``-D tensor is not one value per matrix (None: it is)."""
    dims = list(range(nd)) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    if sorted(d % nd for d in dims) != [nd - 2, nd - 1]:
        return f"{node.name} reduces dims {dims} of a {nd}-D tensor, not each matrix"
    if nd == 3 and not keepdim:
        return f"{node.name} drops the reduced dims of a batch, so it does not divide each matrix"
    return None


def cast_dtype(node: fx.Node, name: str) -> torch.dtype | None:
    """The dtype a cast node converts to (``.bfloat16()``, ``.to(dtype)``, ``.type(dtype)``,
    optionally ``copy=`` / ``non_blocking=``), None if it is no plain dtype conversion."""
    dtype = CASTS.get(name)
    if dtype is None and name in ("to", "type"):
        extra = [*node.args[1:], *(v for k, v in node.kwargs.items() if k not in ("copy", "non_blocking"))]
        dtype = extra[0] if len(extra) == 1 and isinstance(extra[0], torch.dtype) else None
    return dtype


def unread_input(node: fx.Node, name: str | None) -> fx.Node | None:
    """The input of ``addmm(input, A, B, beta=0)``: multiplied by zero, ignored (not read)."""
    if name == "addmm" and node.kwargs.get("beta", 1) in (0, 0.0) and node.args and isinstance(node.args[0], fx.Node):
        return node.args[0]
    return None


def depends_on(node: fx.Node, targets: set[fx.Node]) -> bool:
    """Whether ``node`` is computed from one of ``targets``."""
    seen, frontier = set(), [node]
    while frontier:
        n = frontier.pop()
        if n in targets:
            return True
        for m in n.all_input_nodes:
            if m not in seen:
                seen.add(m)
                frontier.append(m)
    return False

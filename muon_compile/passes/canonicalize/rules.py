"""The abstract value of a node that is no step of a loop, from the values of its arguments:
a transpose (a :class:`~.values.View`), a norm and the arithmetic on it (a
:class:`~.values.NormOf`), the Frobenius norm spelled out (:class:`~.values.SquaresOf`), a
tensor the graph fixes (a :class:`~.values.Const`) and the identity matrix. Each is a pure
function of the node; where a value starts or continues a loop is :mod:`.walk`'s business.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx

from .algebra import Identity, scaled
from .nodes import argument, cast_dtype, example_value, literal, per_matrix_problem
from .values import Const, NormOf, Raw, ReciprocalOf, SquaresOf, View, is_scalar

_CONST_ARITHMETIC = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "neg": torch.neg}
_FROBENIUS_ORDS = ("fro", 2, 2.0)
# the node kinds (nodes.node_kind) that transpose() and norm() read
TRANSPOSES = ("getattr", "transpose", "t", "mT")
NORMS = ("norm", "linalg_norm", "vector_norm", "matrix_norm")


def transpose(node: fx.Node, name: str) -> View | None:
    """A transpose of the last two dimensions of a 2-D or 3-D tensor (``.T``, ``.mT``,
    ``transpose(-2, -1)``, ``t()``) as a :class:`View` of its input; None for any other."""
    src = node.args[0] if node.args else None
    t = example_value(src)
    if not isinstance(src, fx.Node) or not isinstance(t, torch.Tensor) or t.dim() not in (2, 3):
        return None
    nd = t.dim()
    if name == "getattr":
        attr = node.args[1] if len(node.args) > 1 else None
        ok = attr == "mT" or (attr == "T" and nd == 2)
    elif name == "transpose":
        dims = [argument(node, 1, "dim0"), argument(node, 2, "dim1")]
        ok = all(isinstance(d, int) for d in dims) and sorted(d % nd for d in dims) == [nd - 2, nd - 1]
    else:  # t() / mT()
        ok = nd == 2 or name == "mT"
    return View(src, True) if ok else None


def norm(node: fx.Node, name: str, x: Any) -> NormOf | None:
    """A norm of the plain matrix ``x``, any spelling, with why it is no per-matrix Frobenius norm."""
    if not isinstance(x, Raw):
        return None
    nd = example_value(node.args[0]).dim()
    if name == "matrix_norm":
        ord_, dim, keepdim = argument(node, 1, "ord", "fro"), argument(node, 2, "dim", (-2, -1)), argument(node, 3, "keepdim", False)
        fro = ord_ == "fro"
    elif name == "linalg_norm":
        ord_, dim, keepdim = argument(node, 1, "ord"), argument(node, 2, "dim"), argument(node, 3, "keepdim", False)
        matrix = isinstance(dim, (tuple, list)) and len(dim) == 2 or dim is None and nd == 2
        fro = ord_ in ("fro", None) if matrix else ord_ in (None, 2, 2.0)
    elif name == "vector_norm":
        ord_, dim, keepdim = argument(node, 1, "ord", 2), argument(node, 2, "dim"), argument(node, 3, "keepdim", False)
        fro = ord_ in (2, 2.0)
    else:  # Tensor.norm / torch.norm
        ord_, dim, keepdim = argument(node, 1, "p", "fro"), argument(node, 2, "dim"), argument(node, 3, "keepdim", False)
        fro = ord_ in _FROBENIUS_ORDS
    if not fro:
        bad = f"{node.name} is the ord={ord_!r} norm, not the Frobenius norm"
    elif node.kwargs.get("dtype") is not None:
        bad = f"{node.name} computes the norm in another dtype"
    else:
        bad = per_matrix_problem(node, nd, dim, keepdim)
    return NormOf(x.origin, bad=bad)


def normalize_norm(node: fx.Node, x: Any) -> NormOf | None:
    """The norm ``F.normalize(M, p=2, dim=(-2, -1), eps)`` divides by: ``max(||M||, eps)``."""
    eps = argument(node, 3, "eps", 1e-12)
    if not isinstance(x, Raw) or not is_scalar(eps):
        return None
    p, dim = argument(node, 1, "p", 2.0), argument(node, 2, "dim", 1)
    nd = example_value(node.args[0]).dim()
    if p not in (2, 2.0):
        bad = f"{node.name} normalises by the p={p!r} norm, not the Frobenius norm"
    else:
        bad = per_matrix_problem(node, nd, dim, keepdim=True)
    return NormOf(x.origin, eps=float(eps), clamp=True, bad=bad)


def fold(node: fx.Node, name: str, args: list, kwargs: dict) -> Const | None:
    """A tensor whose values are fixed by the graph, evaluated on the CPU: ``torch.tensor``
    of numbers, an element of such a tensor, or a cast of one."""
    if name == "tensor" and args and literal(args[0]) and all(literal(v) for k, v in kwargs.items() if k != "device"):
        values = {k: v for k, v in kwargs.items() if k not in ("device", "pin_memory", "requires_grad")}
        return Const(torch.as_tensor(args[0], **values))
    if name in _CONST_ARITHMETIC and not kwargs and 1 <= len(args) <= 2 and all(isinstance(a, Const) or is_scalar(a) for a in args):
        values = [a.value if isinstance(a, Const) else a for a in args]  # ``1 - c`` too
        inputs = frozenset().union(*(a.inputs for a in args if isinstance(a, Const)))
        return Const(_CONST_ARITHMETIC[name](*values), inputs)
    x = args[0] if args else None
    if not isinstance(x, Const):
        return None
    if name == "getitem" and len(args) == 2 and isinstance(args[1], int):
        return Const(x.value[args[1]], x.inputs)
    dtype = cast_dtype(node, name)
    return Const(x.value.to(dtype), x.inputs) if dtype is not None else None


def squares(node: fx.Node, name: str, args: list, kwargs: dict) -> Any:
    """The Frobenius norm spelled out: ``M.square()`` / ``M * M`` / ``M ** 2``, then
    ``.sum(dims)``, then ``.sqrt()`` (a :class:`NormOf`) or ``torch.rsqrt`` (its
    :class:`ReciprocalOf`). An eps added under the root is no eps of the op."""
    x = args[0] if args else None
    if name == "square" and isinstance(x, Raw):
        return SquaresOf(x.origin)
    if name == "pow" and isinstance(x, Raw) and argument(node, 1, "exponent") in (2, 2.0):
        return SquaresOf(x.origin)
    if name == "mul" and len(args) == 2 and isinstance(args[1], Raw) and args[1] == x:
        return SquaresOf(x.origin)
    if name == "sum" and isinstance(x, SquaresOf) and not x.summed:
        nd = example_value(node.args[0]).dim()
        if kwargs.get("dtype") is not None:
            return SquaresOf(x.origin, True, f"{node.name} sums in another dtype")
        return SquaresOf(x.origin, True, per_matrix_problem(node, nd, argument(node, 1, "dim"), argument(node, 2, "keepdim", False)))
    if name == "add" and isinstance(x, SquaresOf) and x.summed and len(args) == 2 and is_scalar(args[1]):
        under_root = f"{node.name} adds eps under the square root; the op adds it to the norm"
        return dataclasses.replace(x, bad=x.bad or under_root)
    if name == "sqrt" and isinstance(x, SquaresOf) and x.summed:
        return NormOf(x.origin, bad=x.bad)
    if name == "rsqrt" and isinstance(x, SquaresOf) and x.summed:
        return ReciprocalOf(NormOf(x.origin, bad=x.bad))
    return None


def norm_arith(node: fx.Node, name: str, args: list, kwargs: dict) -> NormOf | None:
    """A norm times or divided by a number, plus an eps, or clamped below by one."""
    x, other = args[0], args[1] if len(args) > 1 else kwargs.get("other", kwargs.get("min"))
    if not isinstance(x, NormOf) and not (name in ("add", "mul") and is_scalar(x)):
        return None
    norm, k = (x, other) if isinstance(x, NormOf) else (other, x)
    if not is_scalar(k):
        return None
    if name == "mul":
        return norm.times(float(k))
    if name == "div" and norm is x:
        return norm.times(1.0 / float(k))
    if name == "add" and kwargs.get("alpha", 1) == 1:
        return norm.plus(k, clamp=False)
    if name in ("clamp", "clamp_min") and argument(node, 2, "max") is None:
        return norm.plus(k, clamp=True)
    return None


def identity(node: fx.Node, name: str, args: list, kwargs: dict) -> Identity | None:
    """``torch.eye(n)``, and what keeps it ``s I`` for each of its matrices: a multiple, a
    cast, a copy, a batch dimension added or expanded in front."""
    out, src = example_value(node), example_value(node.args[0]) if node.args else None
    if not isinstance(out, torch.Tensor) or out.dim() < 2 or out.shape[-1] != out.shape[-2]:
        return None
    if name == "eye":
        return Identity() if len(node.args) == 1 and set(kwargs) <= {"dtype", "device", "layout", "requires_grad", "pin_memory"} else None
    x = args[0]
    if name in ("mul", "div") and len(args) == 2 and not kwargs:
        eye, k = (x, args[1]) if isinstance(x, Identity) else (args[1], x)
        # a Python number only: a tensor's value would have to be checked at run time
        if not (isinstance(eye, Identity) and isinstance(k, (int, float))) or (name == "div" and eye is not x):
            return None
        return scaled(eye, float(k) if name == "mul" else 1.0 / float(k))
    keeps = name in ("contiguous", "clone", "unsqueeze", "expand") or cast_dtype(node, name) is not None
    if isinstance(x, Identity) and keeps and isinstance(src, torch.Tensor) and src.shape[-2:] == out.shape[-2:]:
        return x
    return None

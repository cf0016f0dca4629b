"""The evaluation behind ``canonicalize``: one in-order walk of a Dynamo graph in the
abstract values of :mod:`.algebra`, returning every candidate Newton–Schulz loop as a
frozen :class:`Chain` (plain data: its start, its input, its norm, its step polynomials,
its members and escapes, or the reason it is not one).

Storage is tracked through the nodes' fake values: a transpose is a view of its input
(same storage, flipped orientation), an in-place op writes a new value into the storage
it mutates, and a read sees the storage's value at that point in the graph. Any other
view of a loop value is opaque: reading the loop through it rejects the loop.

A small floating-point graph input that the graph never writes (an eps or coefficients
kept as tensors on the optimizer) reads as a :class:`Const` of its value at compile time
when the caller passes the graph's real inputs; a chain that uses one lists it in
``Chain.fixed``, and ``canonicalize`` makes the compiled step check it keeps that value.
"""

from __future__ import annotations

import builtins
import dataclasses
import operator
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from muon_compile.compile.compat import VIEW_ATTRIBUTE_OPS
from muon_compile.passes.fx_writes import storage_of as _storage
from muon_compile.passes.fx_writes import written_args

from ..graph_utils import local_value
from .algebra import (
    CHAIN_VALUES,
    GRAM,
    ONE,
    Gram,
    Identity,
    Odd,
    Transfer,
    Value,
    combine,
    gram_step,
    next_iterate,
    poly_add,
    product,
    scaled,
)

__all__ = ["Chain", "Escape", "NormOf", "example_value", "node_kind", "walk_graph"]

# --------------------------------------------------------------------------- node kinds

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
_CASTS = {"bfloat16": torch.bfloat16, "half": torch.float16, "float": torch.float32, "double": torch.float64}
_CONST_ARITHMETIC = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "neg": torch.neg}
_FROBENIUS_ORDS = ("fro", 2, 2.0)
_MAX_FIXED_NUMEL = 64  # a graph input larger than this is data, never a table of coefficients
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


def _default_diagonal(node: fx.Node) -> bool:
    """``X.diagonal()`` of the last two dimensions (any spelling of the default)."""
    offset = _arg(node, 1, "offset", 0)
    dims = (_arg(node, 2, "dim1", None), _arg(node, 3, "dim2", None))
    rank = getattr(example_value(node.args[0]), "ndim", None)
    last_two = {(None, None), (-2, -1)} | ({(0, 1)} if rank == 2 else set()) | ({(rank - 2, rank - 1)} if rank else set())
    return offset == 0 and dims in last_two


def _arg(node: fx.Node, index: int, key: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(key, default)


def example_value(node: Any) -> Any:
    return node.meta.get("example_value") if isinstance(node, fx.Node) else None


def _same_layout(node: fx.Node, src: Any) -> bool:
    """Whether ``node`` is ``src``'s storage seen as ``src`` is: its dtype (not a ``view(dtype)``'s
    reinterpretation), shape, strides and offset."""
    a, b = example_value(node), example_value(src)
    return (
        isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _storage(node) == _storage(src)
        and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        and a.storage_offset() == b.storage_offset()
    )


def _reads_metadata(node: fx.Node) -> bool:
    """``x.size()``, ``x.shape`` ...: reads no values, so it is no escape."""
    if node.op == "call_method":
        return node.target in _METADATA
    return node.target is builtins.getattr and not isinstance(example_value(node), torch.Tensor)


def _is_scalar(x: Any) -> bool:
    """A number the op can take: a Python int / float or a folded one-element tensor constant."""
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) or (isinstance(x, Const) and x.value.numel() == 1)


def _literal(x: Any) -> bool:
    """A Python number, or a (nested) list / tuple of them: the arguments ``torch.tensor`` folds."""
    if isinstance(x, (list, tuple)):
        return all(_literal(v) for v in x)
    return isinstance(x, (int, float, bool, torch.dtype)) or x is None


def _per_matrix_problem(node: fx.Node, nd: int, dim: Any, keepdim: bool) -> str | None:
    """Why a reduction over ``dim`` of an ``nd``-D tensor is not one value per matrix (None: it is)."""
    dims = list(range(nd)) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    if sorted(d % nd for d in dims) != [nd - 2, nd - 1]:
        return f"{node.name} reduces dims {dims} of a {nd}-D tensor, not each matrix"
    if nd == 3 and not keepdim:
        return f"{node.name} drops the reduced dims of a batch, so it does not divide each matrix"
    return None


def _cast_dtype(node: fx.Node, name: str) -> torch.dtype | None:
    """The dtype a cast node converts to (``.bfloat16()``, ``.to(dtype)``, ``.type(dtype)``,
    optionally ``copy=`` / ``non_blocking=``), None if it is no plain dtype conversion."""
    dtype = _CASTS.get(name)
    if dtype is None and name in ("to", "type"):
        extra = [*node.args[1:], *(v for k, v in node.kwargs.items() if k not in ("copy", "non_blocking"))]
        dtype = extra[0] if len(extra) == 1 and isinstance(extra[0], torch.dtype) else None
    return dtype


def _unread_input(node: fx.Node, name: str | None) -> fx.Node | None:
    """The input of ``addmm(input, A, B, beta=0)``: multiplied by zero, ignored (not read)."""
    if name == "addmm" and node.kwargs.get("beta", 1) in (0, 0.0) and node.args and isinstance(node.args[0], fx.Node):
        return node.args[0]
    return None


def _written_storages(graph: fx.Graph) -> set[StorageWeakRef]:
    """The storages the graph writes in place (:func:`muon_compile.passes.fx_writes.written_args`)."""
    return {_storage(t) for node in graph.nodes for t in written_args(node)} - {None}


def _coefficient_table(node: fx.Node, value: torch.Tensor) -> bool:
    """A ``(k, 3)`` table only indexed (``table[i]``): one ``(a, b, c)`` row per iteration."""
    return value.dim() == 2 and value.shape[1] == 3 and all(u.target is operator.getitem for u in node.users)


def _fixed_inputs(graph: fx.Graph, input_values: Mapping[fx.Node, Any]) -> dict[fx.Node, torch.Tensor]:
    """The graph inputs whose compile-time values the walk may fold: small floating-point
    scalars, vectors and ``(k, 3)`` coefficient tables (not DTensors, not requiring grad)
    that the graph never writes, as CPU copies. A matrix of another shape is data."""
    fixed: dict[fx.Node, torch.Tensor] = {}
    written = _written_storages(graph) if input_values else set()
    for node, value in input_values.items():
        if (
            type(value) is torch.Tensor  # a real tensor: no fake, DTensor or other subclass
            and value.dtype.is_floating_point
            and value.numel() <= _MAX_FIXED_NUMEL
            and (value.dim() <= 1 or _coefficient_table(node, value))
            and not value.requires_grad
            and _storage(node) not in written
        ):
            fixed[node] = value.detach().cpu().clone()
    return fixed


def _pending_key(v: Value) -> tuple:
    """An odd value up to orientation (a transpose reads the same scalar factors)."""
    if isinstance(v, Odd):
        return (v.chain, v.it, v.poly, v.scale)
    return (v.chain, v.it, v.poly, v.side, getattr(v, "start", None))


# ------------------------------------------------------------------ abstract values

@dataclasses.dataclass(frozen=True)
class Origin:
    """One state of one storage: the node that created it, and how many in-place writes followed."""

    root: fx.Node
    version: int


@dataclasses.dataclass(frozen=True)
class Raw:
    """A plain matrix: the content of storage state ``origin``, transposed if ``t``."""

    origin: Origin
    t: bool = False


@dataclasses.dataclass(frozen=True)
class NormOf:
    """``||origin|| * scale + eps`` (or ``max(||origin|| * scale, eps)``); ``bad`` says why it is no
    per-matrix Frobenius norm."""

    origin: Origin
    scale: float = 1.0
    eps: float = 0.0
    clamp: bool = False
    bad: str | None = None
    inputs: frozenset[fx.Node] = frozenset()  # graph inputs whose values the scale and eps came from
    given: bool = False  # no division at all: the loop's input is taken as normalised (see ``_given_start``)

    def plus(self, eps: float, clamp: bool) -> NormOf | None:
        if self.eps != 0.0 or self.clamp:
            return None
        return dataclasses.replace(self, eps=float(eps), clamp=clamp)

    def times(self, s: float) -> NormOf | None:
        if self.eps != 0.0 or self.clamp:
            return None
        return dataclasses.replace(self, scale=self.scale * s)

    def then_times(self, s: float) -> NormOf | None:
        """The whole norm, eps included, times ``s > 0``: ``(n + eps) s = n s + eps s`` and
        ``max(n, eps) s = max(n s, eps s)`` (a second division of the normalised matrix)."""
        if not s > 0:
            return None
        return dataclasses.replace(self, scale=self.scale * s, eps=self.eps * s)


@dataclasses.dataclass(frozen=True, eq=False)
class Const:
    """A tensor whose values the graph fixes (``torch.tensor(1e-7)``, an element of
    ``torch.tensor([a, b, c])``, arithmetic on those), folded on the CPU: a coefficient or
    eps given as a tensor. ``inputs``: the graph inputs it was computed from, whose values
    at compile time it holds."""

    value: torch.Tensor
    inputs: frozenset[fx.Node] = frozenset()

    def __float__(self) -> float:
        return float(self.value)


@dataclasses.dataclass(frozen=True)
class SquaresOf:
    """``origin ** 2`` elementwise; ``summed``: then summed (``bad`` says why that sum is
    not one per matrix). Its square root is a :class:`NormOf`."""

    origin: Origin
    summed: bool = False
    bad: str | None = None


@dataclasses.dataclass(frozen=True)
class ReciprocalOf:
    """``1 / norm``: multiplying by it divides by the norm."""

    norm: NormOf


_OPAQUE_VIEW = object()  # a chain value read through a view other than a transpose


@dataclasses.dataclass(frozen=True)
class View:
    """A node that is a transpose view of ``source`` (``flip``: transposed relative to it)."""

    source: fx.Node
    flip: bool


@dataclasses.dataclass(frozen=True)
class Escape:
    """``user``, which is no iteration step, reads chain value ``value`` through its argument
    ``arg``: as it is, or (``through``) as the in-place op ``through`` left it; ``updates``:
    ``user`` writes it in place."""

    user: fx.Node
    arg: fx.Node
    value: Odd
    through: fx.Node | None = None
    updates: bool = False


@dataclasses.dataclass(frozen=True)
class Updated:
    """A storage that held the chain value ``value`` (relative to its root) until ``by``, no
    iteration step, wrote it in place (``v.mul_(scale)`` on the loop's result); ``by``'s
    result is oriented ``orient`` relative to the root."""

    value: Odd
    by: fx.Node
    orient: bool


@dataclasses.dataclass(frozen=True)
class Chain:
    """One candidate Newton–Schulz loop, as the walk found it.

    ``steps`` holds the step polynomial of each finished iteration (the last step is read
    off the escapes by the matcher); ``reason`` says why the walk already knows it is not
    a recognisable loop (None if it does not).
    """

    id: int
    start: fx.Node  # the division by the norm
    source: fx.Node  # the node whose storage holds M (the op's input)
    norm: NormOf
    dtype: torch.dtype
    steps: tuple[tuple[float, ...], ...]
    iterates: bool  # a Gram matrix was formed: this looks like Newton–Schulz
    members: tuple[fx.Node, ...]
    escapes: tuple[Escape, ...]
    reason: str | None
    fixed: tuple[tuple[fx.Node, torch.Tensor], ...] = ()  # graph inputs read as constants, with their values
    gram: bool = False  # an iteration ended on the Gram matrix (``R <- Z R Z``): the loop iterates on it
    restarts: tuple[int, ...] = ()  # iterations before which an accumulated factor multiplied X (``X <- Q X``)


@dataclasses.dataclass
class _Loop:
    """A :class:`Chain` while the walk builds it."""

    id: int
    start: fx.Node
    source: fx.Node
    norm: NormOf
    dtype: torch.dtype
    steps: list[tuple[float, ...]] = dataclasses.field(default_factory=list)
    iterates: bool = False
    members: list[fx.Node] = dataclasses.field(default_factory=list)
    escapes: list[Escape] = dataclasses.field(default_factory=list)
    reason: str | None = None
    fixed: dict[fx.Node, torch.Tensor] = dataclasses.field(default_factory=dict)
    gram: bool = False
    restarts: set[int] = dataclasses.field(default_factory=set)

    @property
    def it(self) -> int:
        """The current iteration: the number of finished steps."""
        return len(self.steps)

    def reject(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def freeze(self) -> Chain:
        return Chain(
            self.id, self.start, self.source, self.norm, self.dtype, tuple(self.steps), self.iterates,
            tuple(self.members), tuple(self.escapes), self.reason, tuple(self.fixed.items()),
            self.gram, tuple(sorted(r for r in self.restarts if r < self.it)),
        )


# ------------------------------------------------------------------------- the walk

class _Walk:
    """One in-order evaluation of the graph (see the module docstring)."""

    def __init__(self, graph: fx.Graph, fixed: Mapping[fx.Node, torch.Tensor]) -> None:
        self.graph = graph
        self.fixed = dict(fixed)  # graph inputs read as constants (:func:`_fixed_inputs`)
        self.pending: dict[tuple, frozenset[fx.Node]] = {}  # odd value -> inputs of its scalar factors
        self.committed: frozenset[fx.Node] = frozenset()  # fixed inputs a chain's step or norm used
        self.consts: dict[fx.Node, tuple[Const, int]] = {}  # folded node -> (value, its storage's version then)
        self.orient: dict[fx.Node, bool] = {}  # a node's orientation relative to its storage's root
        self.root: dict[StorageWeakRef, fx.Node] = {}
        self.version: dict[StorageWeakRef, int] = {}
        self.state: dict[StorageWeakRef, Any] = {}  # Raw | NormOf | Odd | Gram, relative to the root
        self.chains: list[_Loop] = []
        # an unoriented alias (``unbind``, ``view``...) and its storage's version when it was made
        self.alias_version: dict[fx.Node, int] = {}
        self.inputs = {_storage(n) for n in graph.nodes if n.op in ("placeholder", "get_attr")} - {None}
        self.diagonals: dict[fx.Node, fx.Node] = {}  # a Gram value's diagonal view -> the Gram value's node
        self.gram_polys: dict[tuple[int, int], set] = {}  # (chain, iteration) -> its Gram values' polynomials of degree <= 2

    # reads and writes ---------------------------------------------------------------

    def read(self, x: Any) -> Any:
        """The abstract value of an argument: a Python constant, Raw, NormOf, Odd, Gram or None."""
        if not isinstance(x, fx.Node):
            return x
        if x in self.fixed:
            return Const(self.fixed[x], frozenset((x,)))
        s = _storage(x)
        if s is None:
            return None
        if x in self.consts and self.consts[x][1] == self.version[s]:
            return self.consts[x][0]  # a folded constant (a view of another one too), not written since
        o = self.orient.get(x)
        value = self.state.get(s)
        if isinstance(value, Updated):
            return value if o is not None else _OPAQUE_VIEW
        if isinstance(value, CHAIN_VALUES):
            if o is None:
                if self.alias_version.get(x) == self.version[s]:
                    return None  # made by a node that read the value: that read is the escape
                return _OPAQUE_VIEW
            return self._current(value.transposed(o) if isinstance(value, Odd) else value)
        if o is None:
            return None
        if value is None:
            return Raw(Origin(self.root[s], self.version[s]), o)
        if isinstance(value, Raw):
            return dataclasses.replace(value, t=value.t ^ o)
        return value  # NormOf

    def _current(self, v: Value) -> Value | None:
        """``v`` re-read at its chain's current iteration (an old iterate is ``X_k``, a
        Gram iteration's accumulated factor a :class:`Transfer`). An earlier iterate ``s X_j``
        stays what it is (a Transfer may multiply it: a restart); any other value of a
        finished iteration makes the chain unrecognisable."""
        chain = self.chains[v.chain]
        while v.it < chain.it:
            nxt = next_iterate(v, chain.steps[v.it])
            if nxt is None and isinstance(v, Odd) and len(v.full()) == 1:
                return v
            if nxt is None:
                chain.reject(f"an intermediate of iteration {v.it} is used after that iteration ended")
                return None
            v = nxt
        return v

    def define(self, node: fx.Node, value: Any, view_of: fx.Node | None = None, flip: bool = False) -> None:
        """Record ``node``'s value: a view (``view_of``) shares its storage, anything else owns one."""
        s = _storage(node)
        if s is None:
            return
        if view_of is not None and view_of in self.orient and _storage(view_of) == s:
            self.orient[node] = self.orient[view_of] ^ flip
            return
        if s in self.root:
            # an op that returned its input (``.to`` a dtype it has): the same view; any
            # other alias of a known storage stays unoriented, so a chain read through it escapes
            src = node.args[0] if node.args else None
            same = isinstance(src, fx.Node) and src in self.orient and _storage(src) == s
            before, after = example_value(src) if same else None, example_value(node)
            # (a view as another dtype, ``bits = X.view(torch.int32)``, is no longer the matrix)
            if same and (before.shape, before.dtype) == (after.shape, after.dtype) and local_value(before).stride() == local_value(after).stride():
                self.orient[node] = self.orient[src]
            else:
                self.alias_version[node] = self.version[s]
            return
        self.root[s], self.version[s], self.orient[node] = node, 0, False
        if value is not None:
            self.state[s] = value

    def mutate(self, target: fx.Node, value: Any, by: fx.Node | None = None) -> None:
        """An in-place op wrote ``value`` (seen through ``target``) to ``target``'s storage;
        ``by``: that op, where it is no iteration step."""
        s = _storage(target)
        if s is None:
            return
        self.version[s] = self.version.get(s, 0) + 1
        o = self.orient.get(target)
        before = self.state.get(s)
        if by is not None and isinstance(before, (Odd, Updated)) and o is not None:
            odd = before.value if isinstance(before, Updated) else before
            self.state[s] = Updated(odd, by, o)  # the loop's result, written by an op after it
        elif isinstance(value, CHAIN_VALUES) and o is not None:
            self.state[s] = value.transposed(o) if isinstance(value, Odd) else value
        elif isinstance(value, NormOf):  # ``n.mul_(s).add_(eps)``: the norm's storage holds the new value
            self.state[s] = value
        else:
            self.state.pop(s, None)

    # the walk -----------------------------------------------------------------------

    def run(self) -> list[Chain]:
        for node in self.graph.nodes:
            if node.op in ("call_function", "call_method"):
                self.visit(node)
            else:  # placeholder, get_attr, call_module, output
                self.escape_all(node)
                self.define(node, None)
        return [loop.freeze() for loop in self.chains]

    def visit(self, node: fx.Node) -> None:
        name, in_place = node_kind(node)
        if self._diagonal(node, name, in_place):
            return
        out = node.kwargs.get("out")
        out = out if isinstance(out, fx.Node) else None
        unread = _unread_input(node, name)
        args = [None if a is unread else self.read(a) for a in node.args]
        kwargs = {k: self.read(v) for k, v in node.kwargs.items() if k != "out"}
        result = self.evaluate(node, name, args, kwargs) if name else None
        result = self._track_inputs(self._gram_of_next(result), args, kwargs)
        if isinstance(result, View):
            self.define(node, None, view_of=result.source, flip=result.flip)
            value = self.read(node)
            if isinstance(value, CHAIN_VALUES):
                self.chains[value.chain].members.append(node)
            return
        if _reads_metadata(node) or name == "empty":  # ``empty_like(X)`` reads X's shape, not its values
            self.define(node, None)
            return
        chain_value = isinstance(result, CHAIN_VALUES)
        if chain_value:
            chain = self.chains[result.chain]
            chain.members.append(node)
            dtype = getattr(example_value(node), "dtype", None)
            if dtype != chain.dtype:
                chain.reject(f"{node.name} computes in {dtype}, the iteration in {chain.dtype}")
        else:
            self.escape_all(node, mutated=node.args[0] if in_place and node.args else None, unread=(out, unread))
        target = node.args[0] if in_place and node.args and isinstance(node.args[0], fx.Node) else out
        if target is not None:  # written in place, or into an ``out=`` buffer
            if chain_value and _storage(target) in self.inputs:
                self.chains[result.chain].reject(f"{node.name} writes the loop's value into a graph input")
            self.mutate(target, result, by=None if chain_value else node)
            self.define(node, None, view_of=target)
        else:
            self.define(node, result)
            if isinstance(result, (Const, Identity)) and _storage(node) is not None:
                self.consts[node] = (result, self.version[_storage(node)])

    def _diagonal(self, node: fx.Node, name: str | None, in_place: bool) -> bool:
        """``G.diagonal()`` of a Gram value ``G``, and ``.add_(c)`` / ``.sub_(c)`` of a
        number on that diagonal: ``G + c I``, written into ``G``'s storage (HeavyBall's and
        DeepSpeed's way to add the identity terms). Whether ``node`` was one of those."""
        if name == "diagonal" and node.args and _default_diagonal(node):
            base = node.args[0]
            value = self.read(base)
            if isinstance(value, Gram) and base in self.orient:
                self.diagonals[node] = base
                self.chains[value.chain].members.append(node)
                return True
            return False
        if not (in_place and name in ("add", "sub") and node.args and node.args[0] in self.diagonals):
            return False
        amount = self.read(node.args[1]) if len(node.args) == 2 else None
        alpha = node.kwargs.get("alpha", 1.0)
        fixed = frozenset()
        if isinstance(amount, Const) and amount.value.numel() == 1:
            amount, fixed = float(amount), amount.inputs
        if not (_is_scalar(amount) and _is_scalar(alpha) and set(node.kwargs) <= {"alpha"}):
            return False
        base = self.diagonals[node.args[0]]
        gram = self.read(base)
        if not isinstance(gram, Gram):
            return False
        sign = 1.0 if name == "add" else -1.0
        self._commit(gram.chain, fixed)
        shifted = Gram(gram.chain, gram.it, poly_add(gram.poly, ONE, 1.0, sign * alpha * amount), gram.side)
        self._note(shifted)
        self.mutate(base, shifted)
        self.chains[gram.chain].members.append(node)
        self.diagonals[node] = base  # ``d.add_(a).add_(b)``
        return True

    def _track_inputs(self, value: Any, args: list, kwargs: dict) -> Any:
        """``value``, noting the graph inputs of the constants it was computed from: a norm
        keeps them; a loop value built from them makes them the chain's (``fixed``); a scalar
        factor on one odd value stays pending (a coefficient once a later step combines it,
        otherwise a scale of the result, which must not be compiled in; see :func:`walk_graph`)."""
        operands = [*args, *kwargs.values()]
        inputs = frozenset().union(*(c.inputs for c in operands if isinstance(c, Const)))
        if isinstance(value, NormOf) and inputs:
            return dataclasses.replace(value, inputs=value.inputs | inputs)
        if isinstance(value, ReciprocalOf) and inputs:
            return ReciprocalOf(dataclasses.replace(value.norm, inputs=value.norm.inputs | inputs))
        if not isinstance(value, CHAIN_VALUES):
            return value
        chain_args = [v for v in operands if isinstance(v, CHAIN_VALUES)]
        carried = [self.pending.get(_pending_key(v)) for v in chain_args]
        inputs = inputs.union(*(c for c in carried if c))
        # one odd value scaled, or odd values that are all scaled ones combined (``X * lr + X * wd``)
        scaling = isinstance(value, Odd) and all(isinstance(v, Odd) for v in chain_args)
        if scaling and (len(chain_args) == 1 or all(carried)):
            if inputs:
                self.pending[_pending_key(value)] = inputs
        else:
            self._commit(value.chain, inputs)
        return value

    def _commit(self, chain: int, inputs: frozenset[fx.Node]) -> None:
        self.chains[chain].fixed.update((n, self.fixed[n]) for n in inputs)
        self.committed |= inputs

    def loose_inputs(self) -> frozenset[fx.Node]:
        """The fixed inputs read only as a scale of a loop's result, never inside a step."""
        return frozenset().union(*self.pending.values()) - self.committed

    def escape_all(self, user: fx.Node, mutated: Any = None, unread: tuple = ()) -> None:
        """``user`` is no iteration step: each chain value it reads escapes the loop (an
        ``out=`` buffer or an input multiplied by ``beta=0`` is written or ignored, not read)."""
        for arg in user.all_input_nodes:
            if arg in unread:
                continue
            value = self.read(arg)
            if value is _OPAQUE_VIEW:
                held = self.state[_storage(arg)]
                chain = self.chains[(held.value if isinstance(held, Updated) else held).chain]
                chain.reject(f"{user.name} reads the iterate through a view ({arg.name})")
            elif isinstance(value, Updated):
                chain = self.chains[value.value.chain]
                o = self.orient[arg]
                if o != value.orient:
                    chain.reject(f"{user.name} reads the iterate {value.by.name} updated in place, transposed")
                current = self._current(value.value.transposed(o))
                if current is not None:
                    chain.escapes.append(Escape(user, arg, current, through=value.by, updates=arg is mutated))
            elif isinstance(value, (Gram, Transfer)):
                self.chains[value.chain].reject(f"a Gram matrix is read by {user.name}, outside the iteration")
            elif isinstance(value, Odd):
                self.chains[value.chain].escapes.append(Escape(user, arg, value, updates=arg is mutated))

    # evaluation of one node ---------------------------------------------------------

    def evaluate(self, node: fx.Node, name: str, args: list, kwargs: dict) -> Any:
        """The node's abstract value, a :class:`View` for a transpose, or None."""
        x = args[0] if args else None
        if name in ("getattr", "transpose", "t", "mT"):
            return self._transpose(node, name)
        if name in ("norm", "linalg_norm", "vector_norm", "matrix_norm"):
            return self._norm(node, name, x)
        if name == "normalize":
            return self._normalize(node, x)
        if name in ("tensor", "getitem") or any(isinstance(a, Const) for a in args):
            folded = self._fold(node, name, args, kwargs)
            if folded is not None:
                return folded
        if name == "eye" or (any(isinstance(a, Identity) for a in args) and not any(isinstance(a, CHAIN_VALUES) for a in args)):
            return self._identity(node, name, args, kwargs)
        if name in ("contiguous", "clone") and isinstance(x, CHAIN_VALUES) and len(args) == 1:
            # a copy holds the same value; a no-op ``contiguous`` is the tensor itself
            return View(node.args[0], False) if _storage(node) == _storage(node.args[0]) else x
        if name in ("flatten", "reshape", "view") and isinstance(x, CHAIN_VALUES) and _same_layout(node, node.args[0]):
            # a reshape to the tensor's own shape is the tensor itself (pytorch-optimizer flattens a
            # stack's batch dimensions into one: for a 3-D stack, a no-op)
            return View(node.args[0], False)
        if name in _CASTS or name in ("to", "type"):
            return self._cast(node, name, x)
        if isinstance(x, (Raw, SquaresOf)) and name in ("square", "pow", "mul", "sum", "add", "sqrt", "rsqrt"):
            squares = self._squares(node, name, args, kwargs)
            if squares is not None:
                return squares
        if name == "reciprocal" and isinstance(x, NormOf):
            return ReciprocalOf(x)
        if name == "mul" and len(args) == 2 and {type(a) for a in args} == {Raw, ReciprocalOf}:
            i = 0 if isinstance(args[0], Raw) else 1
            return self._start(node, node.args[i], args[i], args[1 - i].norm)
        if isinstance(x, NormOf) or (len(args) > 1 and isinstance(args[1], NormOf)):
            return self._norm_arith(node, name, args, kwargs)
        if name == "matmul" and len(args) == 2 and isinstance(args[0], Raw) and isinstance(args[1], Raw):
            return self._given_start(node.args[0], *args)
        chains = {v.chain for v in (*args, *kwargs.values()) if isinstance(v, CHAIN_VALUES)}
        if len(chains) != 1:
            return None
        if name in ("add", "sub"):
            other = args[1] if len(args) > 1 else kwargs.get("other")
            alpha = kwargs.get("alpha", 1)
            if not (_is_scalar(alpha) and isinstance(x, (*CHAIN_VALUES, Identity)) and isinstance(other, (*CHAIN_VALUES, Identity))):
                return None
            return combine(x, other, 1.0, float(alpha) * (-1.0 if name == "sub" else 1.0))
        if name in ("mul", "div"):
            other = args[1] if len(args) > 1 else kwargs.get("other")
            if "rounding_mode" in kwargs:
                return None
            if isinstance(x, CHAIN_VALUES) and _is_scalar(other):
                factor = float(other) if name == "mul" else 1.0 / float(other)
                return self._renormalised(node, x, factor) or scaled(x, factor)
            if name == "mul" and _is_scalar(x) and isinstance(other, CHAIN_VALUES):
                return scaled(other, float(x))
            return None
        if name == "neg" and isinstance(x, CHAIN_VALUES):
            return scaled(x, -1.0)
        if name == "matmul" and len(args) == 2:
            return self._matmul(*args)
        if name == "addmm" and len(args) >= 3:
            beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
            prod = self._matmul(args[1], args[2])
            if _unread_input(node, name) is not None and _is_scalar(alpha) and prod is not None:
                return scaled(prod, float(alpha))  # beta=0: the input is ignored
            if not (_is_scalar(beta) and _is_scalar(alpha) and isinstance(x, CHAIN_VALUES) and prod is not None):
                return None
            return combine(x, prod, float(beta), float(alpha))
        return None

    def _transpose(self, node: fx.Node, name: str) -> Any:
        src = node.args[0] if node.args else None
        t = example_value(src)
        if not isinstance(src, fx.Node) or not isinstance(t, torch.Tensor) or t.dim() not in (2, 3):
            return None
        nd = t.dim()
        if name == "getattr":
            attr = node.args[1] if len(node.args) > 1 else None
            ok = attr == "mT" or (attr == "T" and nd == 2)
        elif name == "transpose":
            dims = [_arg(node, 1, "dim0"), _arg(node, 2, "dim1")]
            ok = all(isinstance(d, int) for d in dims) and sorted(d % nd for d in dims) == [nd - 2, nd - 1]
        else:  # t() / mT()
            ok = nd == 2 or name == "mT"
        return View(src, True) if ok else None

    def _norm(self, node: fx.Node, name: str, x: Any) -> Any:
        if not isinstance(x, Raw):
            return None
        nd = example_value(node.args[0]).dim()
        if name == "matrix_norm":
            ord_, dim, keepdim = _arg(node, 1, "ord", "fro"), _arg(node, 2, "dim", (-2, -1)), _arg(node, 3, "keepdim", False)
            fro = ord_ == "fro"
        elif name == "linalg_norm":
            ord_, dim, keepdim = _arg(node, 1, "ord"), _arg(node, 2, "dim"), _arg(node, 3, "keepdim", False)
            matrix = isinstance(dim, (tuple, list)) and len(dim) == 2 or dim is None and nd == 2
            fro = ord_ in ("fro", None) if matrix else ord_ in (None, 2, 2.0)
        elif name == "vector_norm":
            ord_, dim, keepdim = _arg(node, 1, "ord", 2), _arg(node, 2, "dim"), _arg(node, 3, "keepdim", False)
            fro = ord_ in (2, 2.0)
        else:  # Tensor.norm / torch.norm
            ord_, dim, keepdim = _arg(node, 1, "p", "fro"), _arg(node, 2, "dim"), _arg(node, 3, "keepdim", False)
            fro = ord_ in _FROBENIUS_ORDS
        if not fro:
            bad = f"{node.name} is the ord={ord_!r} norm, not the Frobenius norm"
        elif node.kwargs.get("dtype") is not None:
            bad = f"{node.name} computes the norm in another dtype"
        else:
            bad = _per_matrix_problem(node, nd, dim, keepdim)
        return NormOf(x.origin, bad=bad)

    def _normalize(self, node: fx.Node, x: Any) -> Any:
        """``F.normalize(M, p=2, dim=(-2, -1), eps)``: ``M / max(||M||, eps)``, a chain start."""
        eps = _arg(node, 3, "eps", 1e-12)
        if not isinstance(x, Raw) or not _is_scalar(eps):
            return None
        p, dim = _arg(node, 1, "p", 2.0), _arg(node, 2, "dim", 1)
        nd = example_value(node.args[0]).dim()
        if p not in (2, 2.0):
            bad = f"{node.name} normalises by the p={p!r} norm, not the Frobenius norm"
        else:
            bad = _per_matrix_problem(node, nd, dim, keepdim=True)
        return self._start(node, node.args[0], x, NormOf(x.origin, eps=float(eps), clamp=True, bad=bad))

    def _fold(self, node: fx.Node, name: str, args: list, kwargs: dict) -> Const | None:
        """A tensor whose values are fixed by the graph, evaluated on the CPU: ``torch.tensor``
        of numbers, an element of such a tensor, or a cast of one."""
        if name == "tensor" and args and _literal(args[0]) and all(_literal(v) for k, v in kwargs.items() if k != "device"):
            values = {k: v for k, v in kwargs.items() if k not in ("device", "pin_memory", "requires_grad")}
            return Const(torch.as_tensor(args[0], **values))
        if name in _CONST_ARITHMETIC and not kwargs and 1 <= len(args) <= 2 and all(isinstance(a, Const) or _is_scalar(a) for a in args):
            values = [a.value if isinstance(a, Const) else a for a in args]  # ``1 - c`` too
            inputs = frozenset().union(*(a.inputs for a in args if isinstance(a, Const)))
            return Const(_CONST_ARITHMETIC[name](*values), inputs)
        x = args[0] if args else None
        if not isinstance(x, Const):
            return None
        if name == "getitem" and len(args) == 2 and isinstance(args[1], int):
            return Const(x.value[args[1]], x.inputs)
        dtype = _cast_dtype(node, name)
        return Const(x.value.to(dtype), x.inputs) if dtype is not None else None

    def _squares(self, node: fx.Node, name: str, args: list, kwargs: dict) -> Any:
        """The Frobenius norm spelled out: ``M.square()`` / ``M * M`` / ``M ** 2``, then
        ``.sum(dims)``, then ``.sqrt()`` (a :class:`NormOf`) or ``torch.rsqrt`` (its
        :class:`ReciprocalOf`). An eps added under the root is no eps of the op."""
        x = args[0] if args else None
        if name == "square" and isinstance(x, Raw):
            return SquaresOf(x.origin)
        if name == "pow" and isinstance(x, Raw) and _arg(node, 1, "exponent") in (2, 2.0):
            return SquaresOf(x.origin)
        if name == "mul" and len(args) == 2 and isinstance(args[1], Raw) and args[1] == x:
            return SquaresOf(x.origin)
        if name == "sum" and isinstance(x, SquaresOf) and not x.summed:
            nd = example_value(node.args[0]).dim()
            if kwargs.get("dtype") is not None:
                return SquaresOf(x.origin, True, f"{node.name} sums in another dtype")
            return SquaresOf(x.origin, True, _per_matrix_problem(node, nd, _arg(node, 1, "dim"), _arg(node, 2, "keepdim", False)))
        if name == "add" and isinstance(x, SquaresOf) and x.summed and len(args) == 2 and _is_scalar(args[1]):
            under_root = f"{node.name} adds eps under the square root; the op adds it to the norm"
            return dataclasses.replace(x, bad=x.bad or under_root)
        if name == "sqrt" and isinstance(x, SquaresOf) and x.summed:
            return NormOf(x.origin, bad=x.bad)
        if name == "rsqrt" and isinstance(x, SquaresOf) and x.summed:
            return ReciprocalOf(NormOf(x.origin, bad=x.bad))
        return None

    def _cast(self, node: fx.Node, name: str, x: Any) -> Any:
        dtype = _cast_dtype(node, name)
        if dtype is None:
            return None
        if isinstance(x, Raw):
            return x  # a converted copy of the same matrix
        if isinstance(x, Odd) and x.it == 0 and x.full() == ONE:
            chain = self.chains[x.chain]
            if chain.iterates:
                return None
            chain.dtype = dtype  # X0 cast before the first Gram product: the iteration's dtype
            return x
        return None

    def _norm_arith(self, node: fx.Node, name: str, args: list, kwargs: dict) -> Any:
        x, other = args[0], args[1] if len(args) > 1 else kwargs.get("other", kwargs.get("min"))
        if name == "div" and isinstance(x, Raw) and isinstance(other, NormOf):
            return self._start(node, node.args[0], x, other)
        if not isinstance(x, NormOf) and not (name in ("add", "mul") and _is_scalar(x)):
            return None
        norm, k = (x, other) if isinstance(x, NormOf) else (other, x)
        if not _is_scalar(k):
            return None
        if name == "mul":
            return norm.times(float(k))
        if name == "div" and norm is x:
            return norm.times(1.0 / float(k))
        if name == "add" and kwargs.get("alpha", 1) == 1:
            return norm.plus(k, clamp=False)
        if name in ("clamp", "clamp_min") and _arg(node, 2, "max") is None:
            return norm.plus(k, clamp=True)
        return None

    def _renormalised(self, node: fx.Node, x: Odd | Gram, factor: float) -> Odd | None:
        """``X0 * factor`` before any Gram product (``X = X / norm; X = X / 1.01``): the same
        ``X0`` of a norm divided by ``factor``; None for any other value, and where the
        undivided ``X0`` could still be read (the node is not in place, and its input has
        other users)."""
        if not (isinstance(x, Odd) and x.it == 0 and x.full() == ONE) or self.chains[x.chain].iterates:
            return None
        source = node.args[0] if node.args else None
        if not node_kind(node)[1] and not (isinstance(source, fx.Node) and len(source.users) == 1):
            return None
        norm = self.chains[x.chain].norm.then_times(1.0 / factor)
        if norm is None:
            return None
        self.chains[x.chain].norm = norm
        return x

    def _start(self, node: fx.Node, source: fx.Node, x: Raw, norm: NormOf) -> Odd | None:
        """``M / norm(M)`` (or ``M * (1 / norm(M))``), ``source`` holding ``M``: the start of a chain."""
        t = example_value(source)
        if not isinstance(t, torch.Tensor) or t.dim() not in (2, 3) or not t.dtype.is_floating_point:
            return None
        chain = _Loop(len(self.chains), node, self.root[_storage(source)], norm, t.dtype)
        if norm.bad:
            chain.reject(norm.bad)
        elif norm.origin != x.origin:
            chain.reject(f"{node.name} divides by the norm of another tensor")
        elif t.requires_grad:
            chain.reject(f"{node.name} divides a tensor that requires grad (the op has no derivative)")
        self.chains.append(chain)
        self._commit(chain.id, norm.inputs)
        # chain values are oriented like the root of M's storage, the op's input
        return Odd(chain.id, 0, ONE, 1.0, self.orient[source])

    def _identity(self, node: fx.Node, name: str, args: list, kwargs: dict) -> Identity | None:
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
        keeps = name in ("contiguous", "clone", "unsqueeze", "expand") or _cast_dtype(node, name) is not None
        if isinstance(x, Identity) and keeps and isinstance(src, torch.Tensor) and src.shape[-2:] == out.shape[-2:]:
            return x
        return None

    def _note(self, value: Gram | Transfer) -> None:
        """Keep the polynomial of degree <= 2 of a Gram value or a Transfer: a step
        :func:`_gram_of_next` may find (``Z``, or ``Q <- Z Q`` with ``Z`` never formed alone)."""
        if len(value.poly) <= 3:
            self.gram_polys.setdefault((value.chain, value.it), set()).add(value.poly)

    def _gram_of_next(self, value: Any) -> Any:
        """``value``, or, for a Gram value ``L q(L)^2`` of the current iteration
        (:func:`~.algebra.gram_step`), the end of that iteration with step ``q``: the value
        is then ``L`` of the next one (a loop iterating on the Gram matrix)."""
        if not isinstance(value, (Gram, Transfer)) or value.it != self.chains[value.chain].it:
            return value
        chain = self.chains[value.chain]
        if isinstance(value, Transfer):
            self._note(value)
            return value
        step = gram_step(value.poly, self.gram_polys.get((chain.id, chain.it), ()))
        if step is None:
            self._note(value)
            return value
        chain.steps.append(step)
        chain.gram = True
        return Gram(chain.id, chain.it, GRAM, value.side)

    def _given_start(self, first: fx.Node, u: Raw, v: Raw) -> Value | None:
        """``Y @ Y^T`` of a plain matrix ``Y`` computed from a normalised one (the start of a
        chain that formed no Gram matrix: a cast the walk cannot read followed the division,
        such as a stochastic rounding through integer bits): a chain whose input is ``Y``,
        taken as it is (the op's ``normalize=False``); the code that made ``Y`` stays.
        ``first``: the product's first argument."""
        s = _storage(first)
        if u.origin != v.origin or u.t == v.t or s not in self.root or self.version[s] != 0:
            return None
        source = self.root[s]  # Y itself (``u``'s origin is the matrix Y was cast from)
        t = example_value(source)
        if not isinstance(t, torch.Tensor) or t.dim() not in (2, 3) or not t.dtype.is_floating_point or t.requires_grad:
            return None
        starts = {c.start for c in self.chains if not c.iterates}  # a division by a norm, however taken
        if not _depends_on(source, starts):
            return None
        chain = _Loop(len(self.chains), source, source, NormOf(u.origin, given=True), t.dtype)
        self.chains.append(chain)
        self.state[s] = Odd(chain.id, 0, ONE)
        return self._matmul(Odd(chain.id, 0, ONE, 1.0, u.t), Odd(chain.id, 0, ONE, 1.0, v.t))

    def _matmul(self, u: Any, v: Any) -> Value | None:
        if not (isinstance(u, CHAIN_VALUES) and isinstance(v, CHAIN_VALUES)) or u.chain != v.chain:
            return None
        if isinstance(u, Transfer) != isinstance(v, Transfer) and Odd in (type(u), type(v)):
            result = product(u, v)  # X <- Q X: the accumulated factor applied (a restart, or the end)
            if result is not None:
                self.chains[u.chain].restarts.add(result.it + 1)
            return result
        chain = self.chains[u.chain]
        if isinstance(u, Odd) and isinstance(v, Odd) and u.t != v.t:
            chain.iterates = True
            p, q = u.full(), v.full()
            if p == q and p != ONE:  # X_{k+1} X_{k+1}^T: step k is over
                if not 2 <= len(p) <= 3:
                    chain.reject(f"step {chain.it} is a polynomial of degree {len(p) - 1} in X X^T, not 1 or 2")
                    return None
                chain.steps.append(p)
                return Gram(chain.id, chain.it, GRAM, "R" if u.t else "L")
        return product(u, v)



def _depends_on(node: fx.Node, targets: set[fx.Node]) -> bool:
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


def walk_graph(graph: fx.Graph, input_values: Mapping[fx.Node, Any] | None = None) -> list[Chain]:
    """Every candidate Newton–Schulz loop of ``graph``, in graph order; the graph is not changed.

    ``input_values`` maps placeholders to the real tensors of the call being compiled: with
    it, small constant inputs (see :func:`_fixed_inputs`) fold like tensors made in the graph.
    """
    fixed = _fixed_inputs(graph, input_values or {})
    while True:  # an input that only scales a result is no constant of the loop: walk again without it
        walk = _Walk(graph, fixed)
        chains = walk.run()
        loose = walk.loose_inputs()
        if not loose:
            return chains
        fixed = {n: v for n, v in fixed.items() if n not in loose}

"""The evaluation behind ``canonicalize``: one in-order walk of a Dynamo graph in the
abstract values of :mod:`.algebra`, returning every candidate Newton–Schulz loop as a
finished :class:`Chain` (plain data: its start, its input, its norm, its step polynomials,
its members and escapes, or the reason it is not one).

The walk is the storage bookkeeping and the loop's steps; what a node is comes from
:mod:`.nodes`, the abstract values from :mod:`.values` and :mod:`.algebra`, and the value of
a node that is no loop step (a norm, a transpose, a folded constant) from :mod:`.rules`.

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

import dataclasses
import operator
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from muon_compile.passes.fx_writes import storage_of as _storage
from muon_compile.passes.fx_writes import written_args

from ..graph_utils import local_value
from . import rules
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
from .nodes import (
    CASTS,
    cast_dtype,
    default_diagonal,
    depends_on,
    example_value,
    node_kind,
    reads_metadata,
    same_layout,
    unread_input,
)
from .values import (
    OPAQUE_VIEW,
    Chain,
    Const,
    Escape,
    NormOf,
    Origin,
    Raw,
    ReciprocalOf,
    SquaresOf,
    Updated,
    View,
    is_scalar,
)

_MAX_FIXED_NUMEL = 64  # a graph input larger than this is data, never a table of coefficients


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
        self.chains: list[Chain] = []
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
            return value if o is not None else OPAQUE_VIEW
        if isinstance(value, CHAIN_VALUES):
            if o is None:
                if self.alias_version.get(x) == self.version[s]:
                    return None  # made by a node that read the value: that read is the escape
                return OPAQUE_VIEW
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
        return [chain.finish() for chain in self.chains]

    def visit(self, node: fx.Node) -> None:
        name, in_place = node_kind(node)
        if self._diagonal(node, name, in_place):
            return
        out = node.kwargs.get("out")
        out = out if isinstance(out, fx.Node) else None
        unread = unread_input(node, name)
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
        if reads_metadata(node) or name == "empty":  # ``empty_like(X)`` reads X's shape, not its values
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
        if name == "diagonal" and node.args and default_diagonal(node):
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
        if not (is_scalar(amount) and is_scalar(alpha) and set(node.kwargs) <= {"alpha"}):
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
            if value is OPAQUE_VIEW:
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
        if name in rules.TRANSPOSES:
            return rules.transpose(node, name)
        if name in rules.NORMS:
            return rules.norm(node, name, x)
        if name == "normalize":  # ``M / max(||M||, eps)``, a chain start
            norm = rules.normalize_norm(node, x)
            return self._start(node, node.args[0], x, norm) if norm is not None else None
        if name in ("tensor", "getitem") or any(isinstance(a, Const) for a in args):
            folded = rules.fold(node, name, args, kwargs)
            if folded is not None:
                return folded
        if name == "eye" or (any(isinstance(a, Identity) for a in args) and not any(isinstance(a, CHAIN_VALUES) for a in args)):
            return rules.identity(node, name, args, kwargs)
        if name in ("contiguous", "clone") and isinstance(x, CHAIN_VALUES) and len(args) == 1:
            # a copy holds the same value; a no-op ``contiguous`` is the tensor itself
            return View(node.args[0], False) if _storage(node) == _storage(node.args[0]) else x
        if name in ("flatten", "reshape", "view") and isinstance(x, CHAIN_VALUES) and same_layout(node, node.args[0]):
            # a reshape to the tensor's own shape is the tensor itself (pytorch-optimizer flattens a
            # stack's batch dimensions into one: for a 3-D stack, a no-op)
            return View(node.args[0], False)
        if name in CASTS or name in ("to", "type"):
            return self._cast(node, name, x)
        if isinstance(x, (Raw, SquaresOf)) and name in ("square", "pow", "mul", "sum", "add", "sqrt", "rsqrt"):
            squares = rules.squares(node, name, args, kwargs)
            if squares is not None:
                return squares
        if name == "reciprocal" and isinstance(x, NormOf):
            return ReciprocalOf(x)
        if name == "mul" and len(args) == 2 and {type(a) for a in args} == {Raw, ReciprocalOf}:
            i = 0 if isinstance(args[0], Raw) else 1
            return self._start(node, node.args[i], args[i], args[1 - i].norm)
        if isinstance(x, NormOf) or (len(args) > 1 and isinstance(args[1], NormOf)):
            if name == "div" and isinstance(x, Raw) and isinstance(args[1], NormOf):
                return self._start(node, node.args[0], x, args[1])
            return rules.norm_arith(node, name, args, kwargs)
        if name == "matmul" and len(args) == 2 and isinstance(args[0], Raw) and isinstance(args[1], Raw):
            return self._given_start(node.args[0], *args)
        chains = {v.chain for v in (*args, *kwargs.values()) if isinstance(v, CHAIN_VALUES)}
        if len(chains) != 1:
            return None
        if name in ("add", "sub"):
            other = args[1] if len(args) > 1 else kwargs.get("other")
            alpha = kwargs.get("alpha", 1)
            if not (is_scalar(alpha) and isinstance(x, (*CHAIN_VALUES, Identity)) and isinstance(other, (*CHAIN_VALUES, Identity))):
                return None
            return combine(x, other, 1.0, float(alpha) * (-1.0 if name == "sub" else 1.0))
        if name in ("mul", "div"):
            other = args[1] if len(args) > 1 else kwargs.get("other")
            if "rounding_mode" in kwargs:
                return None
            if isinstance(x, CHAIN_VALUES) and is_scalar(other):
                factor = float(other) if name == "mul" else 1.0 / float(other)
                return self._renormalised(node, x, factor) or scaled(x, factor)
            if name == "mul" and is_scalar(x) and isinstance(other, CHAIN_VALUES):
                return scaled(other, float(x))
            return None
        if name == "neg" and isinstance(x, CHAIN_VALUES):
            return scaled(x, -1.0)
        if name == "matmul" and len(args) == 2:
            return self._matmul(*args)
        if name == "addmm" and len(args) >= 3:
            beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
            prod = self._matmul(args[1], args[2])
            if unread_input(node, name) is not None and is_scalar(alpha) and prod is not None:
                return scaled(prod, float(alpha))  # beta=0: the input is ignored
            if not (is_scalar(beta) and is_scalar(alpha) and isinstance(x, CHAIN_VALUES) and prod is not None):
                return None
            return combine(x, prod, float(beta), float(alpha))
        return None

    def _cast(self, node: fx.Node, name: str, x: Any) -> Any:
        dtype = cast_dtype(node, name)
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
        chain = Chain(len(self.chains), node, self.root[_storage(source)], norm, t.dtype)
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
        if not depends_on(source, starts):
            return None
        chain = Chain(len(self.chains), source, source, NormOf(u.origin, given=True), t.dtype)
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

"""stack_writes: a bucket's per-parameter writes become one stacked write.

A per-parameter Muon (``torch.optim.Muon``, Moonlight's, most hand-written ones) writes each
parameter on its own: ``p.mul_(1 - lr * wd); p.add_(O, alpha=-lr * scale)``. After
``bucket`` every ``O`` is a view of a bucket's batched result, and Inductor's GPU code would
launch a kernel for each parameter's write. Members of one bucket written alike (the same
decay factor and step, the same shape, orientation and dtype) are written by one
``muon_compile::unstack_scale_add_`` (the stacked optimizer's own write, one launch of its
Triton kernel) that reads the bucket's result through one view: no value is copied for it.
Only where that write runs in one pass (:func:`muon_compile.optim.stacks.writes_in_one_pass`:
CUDA): elsewhere it is two ``foreach`` passes, where Inductor writes each member in one.

Algorithm:
  1. Plan: a member write is ``copy_(p, v)`` into a graph input ``p``, ``v`` read by nothing
     else and of ``p``'s dtype, of the form ``p * s + a * O`` (``add`` / ``sub`` with
     ``alpha``, ``O`` times a 0-D tensor in ``p``'s dtype, or ``prims.fma(O, a, p * s)``;
     ``s`` absent, a number or a 0-D tensor; ``O`` maybe times a number in its own dtype,
     the write's ``src_scale``) where ``O`` is matrix ``i`` of a 3-D result
     ``B``: ``B[o:]`` cut to ``p``'s rows and columns, maybe transposed, then matrix ``j``
     of it (``squeeze``, ``select``, ``unbind``; ``i = o + j``), maybe cast up exactly.
     Members are grouped by ``B``, what ``s`` and ``a`` compute, orientation, shape and
     dtype; each group, in ``i`` order, splits into runs of equal stride.
  2. Apply: per run of two or more members, ``src = B[i0:i1:step, :rows, :cols]``
     (transposed like the members), one write of the run's parameters, placed after the
     last other read of them; each ``copy_`` copies that write's result for its parameter
     (Inductor writes in place), and the per-member arithmetic nothing else reads is erased.

Before / after::

    d0 = mul(p0, 0.998); o0 = squeeze(permute(slice(B, 0, 0, 1), [0, 2, 1]), 0)
    copy_(p0, add(d0, o0, alpha=-0.03));   ... the same for p1 with B[1:2]
 -> w = auto_functionalized_v2(unstack_scale_add_, scale=0.998, src=permute(slice(B, 0, 0, 2), [0, 2, 1]),
                               alpha=-0.03, _all_bases=[p0, p1])
    copy_(p0, w[1]); copy_(p1, w[2])

An update scaled by a number in its own dtype after the slice (Keller's ``u *= scale``; torch
2.11's ``add_(u, alpha=a)``, traced as ``u * a``) is the write's ``src_scale``. Left per
parameter (Inductor fuses each write with what computes its update): an update computed
otherwise after the slice (a NorMuon factor), a decay that is not ``p * s``, a masked one,
3-D members, a member alone in its group.
"""

from __future__ import annotations

import dataclasses
import operator
from collections import defaultdict
from collections.abc import Sequence

import torch
import torch.fx as fx
from torch._higher_order_ops.auto_functionalize import auto_functionalized_v2

from muon_compile.diagnostics.counters import counters
from muon_compile.optim import stacks

from ..graph_utils import splice_trace
from .write_source import exact_cast_up

aten = torch.ops.aten
_COPY = aten.copy_.default
_FMA = torch.ops.prims.fma.default
_VIEW_SAME_SHAPE = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.clone.default)

Factor = float | fx.Node  # a number, or a 0-D tensor node


@dataclasses.dataclass(frozen=True)
class MemberWrite:
    """``copy`` writes ``param * scale + alpha * (src_scale * base[index, :rows, :cols])``
    (transposed if ``transposed``; the product by ``src_scale`` rounded to ``base``'s dtype);
    ``scale`` None is 1, ``negated``: ``-alpha`` (a tensor's negation); ``arithmetic``: the
    per-member nodes computing it."""

    copy: fx.Node
    param: fx.Node
    base: fx.Node
    index: int
    rows: int
    cols: int
    transposed: bool
    scale: Factor | None
    alpha: Factor
    negated: bool
    src_scale: float
    arithmetic: tuple[fx.Node, ...]

    def group_key(self) -> tuple:
        val = self.param.meta["val"]
        factors = (_value_key(self.scale), _value_key(self.alpha), self.negated, self.src_scale)
        return (self.base, factors, self.transposed, self.rows, self.cols, val.dtype, tuple(val.shape))


@dataclasses.dataclass(frozen=True)
class StackedWrite:
    """One write of ``members`` (two or more, ``base`` indices ``start + k * step``)."""

    members: tuple[MemberWrite, ...]

    @property
    def start(self) -> int:
        return self.members[0].index

    @property
    def step(self) -> int:
        return self.members[1].index - self.members[0].index

    def describe(self) -> str:
        first = self.members[0]
        shape = "x".join(map(str, first.param.meta["val"].shape))
        last = self.members[-1].index
        view = f"{first.base.name}[{self.start}:{last + 1}:{self.step}]" + (".mT" if first.transposed else "")
        return f"one write of {len(self.members)} x {shape} from {view}: {', '.join(m.param.name for m in self.members)}"


def plan_stack_writes(graph: fx.Graph) -> list[StackedWrite]:
    """The runs of member writes (algorithm step 1), in graph order of their first copy;
    none where the stacked write would not run in one pass (:func:`muon_compile.optim.stacks.writes_in_one_pass`)."""
    groups: dict[tuple, list[MemberWrite]] = defaultdict(list)
    for copy in graph.find_nodes(op="call_function", target=_COPY):
        if (member := _member_write(copy)) is None:
            continue
        param, base = member.param.meta["val"], member.base.meta["val"]
        if param.is_contiguous() and stacks.writes_in_one_pass(param.device, param.dtype, base.dtype):
            groups[member.group_key()].append(member)
    writes = []
    for members in groups.values():
        writes.extend(_runs(sorted(members, key=lambda m: m.index)))
    order = {n: i for i, n in enumerate(graph.nodes)}
    return sorted(writes, key=lambda w: order[w.members[0].copy])


def apply_stack_writes(graph: fx.Graph, writes: Sequence[StackedWrite]) -> None:
    """One stacked write per run (algorithm step 2)."""
    for write in writes:
        _rewrite(graph, write)
        counters["stack_writes.writes"] += 1
        counters["stack_writes.members"] += len(write.members)


def _runs(members: list[MemberWrite]) -> list[StackedWrite]:
    """``members`` (sorted by index) cut into maximal runs of equal stride, two or more each."""
    runs, current = [], members[:1]
    for m in members[1:]:
        step = m.index - current[-1].index  # 0: one matrix written into two parameters
        if step > 0 and (len(current) == 1 or step == current[1].index - current[0].index):
            current.append(m)
        else:
            runs.append(current)
            current = [m]
    runs.append(current)
    return [StackedWrite(tuple(run)) for run in runs if len(run) > 1]


def _rewrite(graph: fx.Graph, write: StackedWrite) -> None:
    first = write.members[0]
    params = [m.param for m in write.members]
    factor_nodes = [f for f in (first.scale, first.alpha) if isinstance(f, fx.Node)]
    stop = write.members[-1].index + 1
    device = first.param.meta["val"].device
    k = len(params)

    def stacked(base: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
        values = dict(zip(factor_nodes, rest))
        src = base[write.start : stop : write.step, : first.rows, : first.cols]
        if first.transposed:
            src = src.mT
        alpha = _factor_tensor(first.alpha, values, device)
        out = auto_functionalized_v2(
            stacks.STACK_WRITE,
            scale=_factor_tensor(first.scale, values, device),
            src=src,
            alpha=-alpha if first.negated else alpha,
            cautious=False,
            src_scale=first.src_scale,
            _dsts_length=k,
            _all_bases=list(rest[len(factor_nodes) :]),
            **{f"_dsts_{j}_base_index": j for j in range(k)},
        )
        return list(out[1:])

    order = {n: i for i, n in enumerate(graph.nodes)}
    erased = {n for m in write.members for n in m.arithmetic}
    # after its inputs and every other read of the parameters (the write's own arithmetic
    # aside), so that Inductor writes in place; no later, so the bucket's result is freed
    # as early as before
    readers = [u for p in params for u in p.users if u not in erased and u.target is not _COPY]
    last = max([first.base, *factor_nodes, *params, *readers], key=order.__getitem__)
    outputs = splice_trace(graph, stacked, [first.base, *factor_nodes, *params], insert_before=last.next)
    for member, new in zip(write.members, outputs):
        old = member.copy.args[1]
        member.copy.replace_input_with(old, new)
        _erase_unused(graph, old)


def _erase_unused(graph: fx.Graph, node: object) -> None:
    """Erase ``node`` if nothing reads it and it has no effect, then so its inputs: the
    member's arithmetic, its view of the bucket and its own copy of the factors."""
    frontier = [node]
    while frontier:
        node = frontier.pop()
        if isinstance(node, fx.Node) and node.op == "call_function" and not node.users and not node.is_impure():
            frontier.extend(node.all_input_nodes)
            graph.erase_node(node)


def _factor_tensor(factor: Factor | None, values: dict[fx.Node, torch.Tensor], device: torch.device) -> torch.Tensor:
    """A write factor as the op takes it, a 0-D tensor: a node's value, or a number (None:
    1) as a float64 scalar on the parameters' device (on CUDA no host tensor, which would
    keep the step out of a CUDA graph)."""
    if isinstance(factor, fx.Node):
        return values[factor]
    return torch.scalar_tensor(1.0 if factor is None else factor, dtype=torch.float64, device=device)


# ------------------------------------------------------------------------------ matching
def _member_write(copy: fx.Node) -> MemberWrite | None:
    """The member write ``copy`` is, or None (algorithm step 1's form)."""
    param, value = copy.args[:2]
    if param.op != "placeholder" or not isinstance(value, fx.Node) or len(value.users) != 1:
        return None
    if value.meta["val"].dtype != param.meta["val"].dtype:
        return None
    affine = _affine(value, param)
    if affine is None:
        return None
    scale, alpha, negated, src_scale, update, arithmetic = affine
    block = _member_block(update, param)
    if block is None:
        return None
    base, index, rows, cols, transposed, views = block
    if src_scale != 1.0 and update.meta["val"].dtype != base.meta["val"].dtype:
        return None  # scaled after a cast: rounded in another dtype than the kernel's src
    fields = (scale, alpha, negated, src_scale, (*arithmetic, *views))
    return MemberWrite(copy, param, base, index, rows, cols, transposed, *fields)


def _affine(value: fx.Node, param: fx.Node) -> tuple | None:
    """``value`` as ``param * scale + alpha * (src_scale * update)``: (scale, alpha,
    negated, src_scale, update, the nodes computing it), or None."""
    if value.target is _FMA and not value.kwargs:  # add_(u, alpha=t) with a tensor t: fma(u, t, decayed)
        decay = _decay(value.args[2], param)
        update = next((u for u in value.args[:2] if isinstance(u, fx.Node) and u.meta["val"].dim() > 0), None)
        if decay is None or update is None:
            return None
        tensor = _factor(value.args[1] if value.args[0] is update else value.args[0])
        if tensor is _NO_MATCH:
            return None
        scale, nodes = decay
        return scale, tensor, False, 1.0, update, (value, *nodes)
    if value.target not in (aten.add.Tensor, aten.sub.Tensor) or len(value.args) != 2:
        return None
    decayed, term = value.args
    alpha = value.kwargs.get("alpha", 1)
    if set(value.kwargs) - {"alpha"} or isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        return None
    decay = _decay(decayed, param)
    if not isinstance(term, fx.Node) or decay is None:
        return None
    scale, decay_nodes = decay
    nodes = (value, *decay_nodes)
    negated = value.target is aten.sub.Tensor
    if term.target is aten.mul.Tensor and alpha == 1 and term.meta["val"].dtype == param.meta["val"].dtype:
        # the update times a 0-D tensor (a tensor lr) in the parameter's dtype
        for update in term.args:
            if isinstance(update, fx.Node) and update.meta["val"].dim() > 0:
                tensor = _other_factor(term, update)
                if isinstance(tensor, fx.Node):
                    return scale, tensor, negated, 1.0, update, (*nodes, term)
    factor = -float(alpha) if negated else float(alpha)
    if term.target is aten.mul.Tensor:  # the update scaled by a number in its own dtype (Keller's u *= scale)
        for update in term.args:
            if isinstance(update, fx.Node) and update.meta["val"].dtype == term.meta["val"].dtype:
                number = _other_factor(term, update)
                if isinstance(number, float):
                    return scale, factor, False, number, update, (*nodes, term)
    return scale, factor, False, 1.0, term, nodes


def _decay(decayed: object, param: fx.Node) -> tuple[Factor | None, tuple[fx.Node, ...]] | None:
    """``decayed`` as ``param * scale``: (scale, None for ``param`` itself; its node), or None."""
    if decayed is param:
        return None, ()
    if not (isinstance(decayed, fx.Node) and decayed.target is aten.mul.Tensor):
        return None
    scale = _other_factor(decayed, param)
    return None if scale is _NO_MATCH else (scale, (decayed,))


_NO_MATCH = object()


def _value_key(value: object) -> object:
    """What ``value`` (a write factor: a number, None or a 0-D node) computes, equal for
    the same computation spelled by several nodes (each parameter's ``1 - lr * wd``)."""
    if not isinstance(value, fx.Node):
        return ("value", value)
    target = value.target
    if (
        value.op != "call_function"
        or not isinstance(target, torch._ops.OpOverload)
        or torch.Tag.nondeterministic_seeded in target.tags
        or value.meta["val"].dim() != 0
    ):
        return value
    return (target, tuple(map(_arg_key, value.args)), tuple(sorted((k, _arg_key(v)) for k, v in value.kwargs.items())))


def _arg_key(arg: object) -> object:
    if isinstance(arg, fx.Node):
        return _value_key(arg)
    if isinstance(arg, (list, tuple)):
        return tuple(map(_arg_key, arg))
    return arg


def _other_factor(mul: fx.Node, operand: fx.Node) -> object:
    """The factor of ``mul`` beside ``operand``: a number, a 0-D tensor node, or _NO_MATCH."""
    if len(mul.args) != 2 or mul.kwargs or operand not in mul.args:
        return _NO_MATCH
    other = mul.args[1] if mul.args[0] is operand else mul.args[0]
    return _NO_MATCH if other is operand else _factor(other)


def _factor(value: object) -> object:
    """``value`` as a write factor: a number (as a float), a 0-D tensor node, or _NO_MATCH."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, fx.Node) and value.meta["val"].dim() == 0:
        return value
    return _NO_MATCH


def _member_block(update: fx.Node, param: fx.Node) -> tuple | None:
    """``update`` as matrix ``index`` of a 3-D ``base`` cut to ``param``'s shape:
    (base, index, rows, cols, transposed, the view nodes), or None. The member is taken
    from a batch view ``X`` of ``base`` (:func:`_batch_view`) by ``squeeze(X, 0)``,
    ``select(X, 0, j)`` or ``unbind(X)[j]``."""
    shape = tuple(param.meta["val"].shape)
    if len(shape) != 2 or tuple(update.meta["val"].shape) != shape:
        return None
    views = []
    node = update
    while isinstance(node, fx.Node) and _same_values(node):  # exact casts up, copies, same-shape views
        views.append(node)
        node = node.args[0]
    if not isinstance(node, fx.Node):
        return None
    views.append(node)
    if node.target is aten.squeeze.dim and node.args[1:] == (0,):
        batch, j = node.args[0], 0
    elif node.target is aten.select.int and node.args[1] == 0:
        batch, j = node.args[0], node.args[2]
    elif node.target is operator.getitem and getattr(node.args[0], "target", None) is aten.unbind.int:
        if node.args[0].args[1:] not in ((), (0,)):
            return None
        batch, j = node.args[0].args[0], node.args[1]
        views.append(node.args[0])
    else:
        return None
    view = _batch_view(batch)
    if view is None or j < 0:
        return None
    base, offset, transposed, batch_views = view
    rows, cols = shape[::-1] if transposed else shape
    return base, offset + j, rows, cols, transposed, (*views, *batch_views)


def _batch_view(node: fx.Node) -> tuple | None:
    """``node`` as ``base[offset:, :rows, :cols]``, transposed or not: (base, offset,
    transposed, the view nodes), or None; ``base`` is 3-D."""
    views = []
    transposed = node.target is aten.permute.default and list(node.args[1]) == [0, 2, 1]
    if transposed:
        views.append(node)
        node = node.args[0]
    while node.target is aten.slice.Tensor and node.args[1] in (1, 2) and _slice(node)[0] == 0:
        views.append(node)  # the block of a padded bucket
        node = node.args[0]
    offset = 0
    if node.target is aten.slice.Tensor and node.args[1] == 0:
        offset, step = _slice(node)
        if offset < 0 or step != 1:
            return None
        views.append(node)
        node = node.args[0]
    if not isinstance(node, fx.Node) or node.op == "placeholder" or node.meta["val"].dim() != 3:
        return None
    return node, offset, transposed, tuple(views)


def _same_values(node: fx.Node) -> bool:
    """Whether ``node`` passes its input's values on unchanged in value: an exact cast up,
    a contiguous copy, a view to the same shape."""
    if not isinstance(node.args[0], fx.Node):
        return False
    source = node.args[0].meta["val"]
    if node.target is torch.ops.prims.convert_element_type.default:
        return exact_cast_up(source.dtype, node.args[1])
    return node.target in _VIEW_SAME_SHAPE and tuple(node.meta["val"].shape) == tuple(source.shape)


def _slice(node: fx.Node) -> tuple[int, int]:
    """A ``slice`` node's start and step (start -1 where not a plain number)."""
    start = node.args[2] if len(node.args) > 2 else 0
    step = node.args[4] if len(node.args) > 4 else 1
    return (start if isinstance(start, int) else -1), step

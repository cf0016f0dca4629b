"""canonicalize: rewrite Newton–Schulz loops of a torch-level (Dynamo) graph into the op.

Runs on the graph Dynamo hands the backend, before AOTAutograd, so a DTensor is still a
tensor and the op can be routed by its layout (:mod:`muon_compile.distributed.routing`) instead of
being desugared into one collective per Gram matrix.

Algorithm:
  1. Evaluate the graph once, in order, in the abstract values of :mod:`.algebra`
     (:mod:`.walk`), following storage through transposes and in-place ops, so
     ``X.div_(n)`` followed by uses of ``X`` reads the divided value.
  2. A chain starts where a matrix ``M`` (2-D, or a 3-D stack) is divided by its own
     Frobenius norm, optionally scaled, plus ``eps`` or clamped at ``eps``, per matrix:
     ``X0 = M / (||M|| * s + eps)``. The norm may be a norm call or spelled out (sum of
     squares, square root or ``rsqrt``), its arithmetic in place on the norm tensor, and
     the division a multiplication by its reciprocal. The division by any other norm
     starts a chain that is only reported, never rewritten.
  3. Products, sums and scalings of chain values stay polynomials of the current iterate.
     The Gram product of a new odd value ``P(L) X_k`` with itself starts iteration k+1:
     ``P`` (degree 1 or 2: ``a + b L + c L^2``) is step k.
  4. A read of a chain value by a node that is not an iteration step (the parameter
     update, the graph output) is an escape. The matcher's verdict on a chain is a
     :class:`Match` when every escape is the last iterate (up to a transpose or a scalar
     factor), every member has the iterate's dtype, and no intermediate is read after its
     iteration; otherwise a :class:`Rejection` with the reason. An op after the loop may
     update the result in place (NorMuon's ``v.mul_(scale)``): it then updates the op's
     result, and later reads of that storage read the op that updated it, provided no
     other copy of the result (another storage, or a scaled one) is read.
  5. Plan, then apply: each recognised chain becomes one op call, right after the
     division, on the node holding ``M`` (a DTensor goes through
     :func:`muon_compile.ns.op.newton_schulz_routed`, which picks the op for its layout)
     with the read-off coefficients, step count, eps, norm scale and dtype; the escapes
     read the op's result (transposed / scaled as they were); the loop's nodes are erased,
     and with them the norm and its in-place arithmetic when nothing else reads them.

Before / after (torch.optim.Muon, one wide matrix)::

    X = update.bfloat16(); X.div_(X.norm().clamp(min=1e-7))          X = update.bfloat16()
    A = X @ X.T; B = addmm(A, A, A, beta=b, alpha=c)             ->   ns = newton_schulz(X, [a, b, c] * 5, 5,
    X = addmm(X, B, X, beta=a)  (5 times)                                   1e-7, 1.0, True, bf16)
    param.add_(X, alpha=-lr)                                          param.add_(ns, alpha=-lr)

Whatever does not match exactly is left as it was, its reason logged and counted
(``canonicalize.rejected``); a match counts ``canonicalize.matched``.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx as fx
from torch.distributed.tensor import DTensor

from muon_compile.diagnostics import explain
from muon_compile.diagnostics.counters import counters
from muon_compile.ns.args import AUTO, GRAM, NSArgs
from muon_compile.ns.op import NEWTON_SCHULZ, newton_schulz_routed
from muon_compile.passes.fx_writes import storage_of

from ..graph_utils import local_value
from . import rules
from .algebra import ONE, Odd, next_iterate, poly_trim
from .nodes import example_value, node_kind
from .values import Chain
from .walk import walk_graph

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Replacement:
    """``user`` reads ``scale * newton_schulz(...)`` (transposed if ``transposed``) instead of ``arg``."""

    user: fx.Node
    arg: fx.Node
    transposed: bool
    scale: float
    through: fx.Node | None = None  # read as the in-place op ``through`` left the result: read ``through``


@dataclasses.dataclass(frozen=True)
class Match:
    """A recognised loop: its escapes read ``newton_schulz(chain.source, args)`` instead."""

    chain: Chain
    args: NSArgs
    replacements: tuple[Replacement, ...]


@dataclasses.dataclass(frozen=True)
class Rejection:
    """A loop that looked like Newton–Schulz (it formed a Gram matrix), left as it was."""

    chain: Chain
    reason: str


# ------------------------------------------------------------------------- the plan

def plan_canonical(graph: fx.Graph, input_values: Mapping[fx.Node, Any] | None = None) -> tuple[list[Match], list[Rejection]]:
    """Recognised loops and rejected ones (those that formed a Gram matrix), as plain data.

    ``input_values`` (placeholder -> the real tensor being compiled for) lets a loop read
    its eps, norm scale or coefficients from small tensor inputs (:func:`walk_graph`).
    """
    matches, rejected = [], []
    for chain in walk_graph(graph, input_values):
        verdict = match_chain(chain)
        if isinstance(verdict, Match):
            matches.append(verdict)
        elif chain.iterates:
            rejected.append(verdict)
    return matches, rejected


def match_chain(chain: Chain) -> Match | Rejection:
    """Step 4: the verdict on one chain (the first reason found, if it is no match)."""
    if chain.reason is not None:
        return Rejection(chain, chain.reason)
    if not chain.escapes:
        return Rejection(chain, "its result is never used")
    finals: list[Odd] = []
    for escape in chain.escapes:
        v: Odd | None = escape.value
        while v is not None and v.it < len(chain.steps):
            v = next_iterate(v, chain.steps[v.it])
        if v is None:
            return Rejection(chain, f"{escape.user.name} reads an intermediate iterate ({escape.arg.name})")
        finals.append(v)
    polys = {v.poly for v in finals}
    if len(polys) > 1:
        return Rejection(chain, "the loop's results differ by more than a transpose or a scale")
    (last,) = polys
    if last == ONE or not 2 <= len(last) <= 3:
        return Rejection(chain, f"the last step is a polynomial of degree {len(last) - 1}, not 1 or 2")
    triples = tuple(tuple(p) + (0.0,) * (3 - len(p)) for p in (*chain.steps, poly_trim(last)))
    norm = chain.norm
    args = NSArgs(
        triples, eps=norm.eps, norm_scale=norm.scale, clamp_eps=norm.clamp, compute_dtype=chain.dtype,
        # a loop on the Gram matrix stays one, restarted where the code restarts it
        algorithm=GRAM if chain.gram else AUTO, restarts=chain.restarts if chain.gram else None,
        normalize=not norm.given,  # an input normalised, then rounded by the code itself: taken as it is
    )
    updating = [e for e in chain.escapes if e.updates and e.through is None]
    direct = [(e, v) for e, v in zip(chain.escapes, finals) if e.through is None]
    if updating and (len({storage_of(e.arg) for e, _ in direct}) > 1 or any(v.scale != 1.0 for _, v in direct)):
        # the op's one result would take the update for every copy of the loop's result
        return Rejection(chain, f"{updating[0].user.name} updates the loop's result in place while another copy of it is read")
    replacements = tuple(Replacement(e.user, e.arg, v.t, v.scale, e.through) for e, v in zip(chain.escapes, finals))
    return Match(chain, args, replacements)


# ------------------------------------------------------------------------ the apply

def apply_canonical(graph: fx.Graph, matches: list[Match]) -> None:
    """Step 5: insert one op per match after its division, rewire the escapes, erase the loop."""
    checked: set[fx.Node] = set()
    for match in matches:
        chain = match.chain
        with graph.inserting_before(chain.start.next):
            for inp, value in chain.fixed:
                if inp not in checked:
                    checked.add(inp)
                    _check_unchanged(graph, inp, value, chain.start)
            x = chain.source
            if example_value(x).dtype != chain.dtype:
                x = _call(graph, "call_method", "to", (x, chain.dtype))
            target = newton_schulz_routed if isinstance(example_value(x), DTensor) else NEWTON_SCHULZ
            ns = _call(graph, "call_function", target, (x, *match.args.to_op()))
            ns.meta["stack_trace"] = chain.start.meta.get("stack_trace")  # the user's line, for explain
        made: dict[tuple[bool, float], fx.Node] = {}
        for r in match.replacements:
            if r.through is not None:  # the result as an op after the loop updated it in place
                r.user.replace_input_with(r.arg, r.through)
                continue
            key = (r.transposed, r.scale)
            if key not in made:
                with graph.inserting_before(ns.next):
                    out = ns
                    if r.scale != 1.0:
                        out = _call(graph, "call_function", operator.mul, (out, r.scale))
                    if r.transposed:
                        out = _call(graph, "call_function", torch.transpose, (out, -2, -1))
                made[key] = out
            r.user.replace_input_with(r.arg, made[key])
        _erase(graph, chain)
        counters["canonicalize.matched"] += 1
        log.debug("canonicalize: %s -> newton_schulz(%s): %s", chain.start.name, chain.source.name, match.args.describe())


def _call(graph: fx.Graph, op: str, target: Any, args: tuple, kwargs: dict | None = None, like: fx.Node | None = None) -> fx.Node:
    """A new node with its fake ``example_value`` computed like Dynamo's (in the fake mode of
    ``like``, default the first argument)."""
    kwargs = kwargs or {}
    node = graph.create_node(op, target, args, kwargs)
    values = [example_value(a) if isinstance(a, fx.Node) else a for a in args]
    with local_value(example_value(like) if like is not None else values[0]).fake_mode:
        fn = getattr(values[0], target) if op == "call_method" else target
        node.meta["example_value"] = fn(*values[1:], **kwargs) if op == "call_method" else fn(*values, **kwargs)
    return node


def _check_unchanged(graph: fx.Graph, inp: fx.Node, value: torch.Tensor, start: fx.Node) -> None:
    """Make the step assert that graph input ``inp`` still holds ``value``, which the op was
    compiled with (a device-side check: no host synchronisation)."""
    where = explain.source_line(start)
    message = (
        f"muon_compile: graph input {inp.name} (the Newton-Schulz loop at {where} reads it) was "
        f"compiled in with the value {value.tolist()} and has changed since. Call torch._dynamo.reset() "
        f"after changing it, or run with MUON_COMPILE_PASSES=-canonicalize to leave the loop as written."
    )
    fake = example_value(inp)
    ref = _call(graph, "call_function", torch.tensor, (value.tolist(),), {"dtype": fake.dtype, "device": fake.device}, like=inp)
    same = _call(graph, "call_method", "all", (_call(graph, "call_method", "eq", (inp, ref)),))
    graph.create_node("call_function", torch._assert_async, (same, message))


def _erase(graph: fx.Graph, chain: Chain) -> None:
    """Erase the loop's nodes, then the norm, its in-place arithmetic and the transposes that
    only they used."""
    members = set(chain.members)
    doomed = set(members)
    for node in reversed(list(graph.nodes)):
        if node not in doomed or node is chain.source:
            continue
        if node.users and _pure_helper(node) and node_kind(node)[0] not in rules.TRANSPOSES:
            _erase_in_place_users(graph, node)  # only on a fresh tensor: a view's writes reach its base
        if node.users:
            continue
        if node in members or _pure_helper(node):
            doomed.update(node.all_input_nodes)
            graph.erase_node(node)


_HELPERS = (
    *rules.TRANSPOSES, *rules.NORMS,
    "clamp", "clamp_min", "add", "mul", "div", "square", "pow", "sum", "sqrt", "rsqrt", "reciprocal",
    "tensor", "getitem", "empty",  # a folded constant, the loop's ``out=`` buffers
)


def _pure_helper(node: fx.Node) -> bool:
    """A norm, a step of its arithmetic, or a transpose view: safe to erase when unused."""
    name, in_place = node_kind(node)
    return not in_place and name in _HELPERS


def _erase_in_place_users(graph: fx.Graph, node: fx.Node) -> None:
    """``n.mul_(s).add_(eps)`` on the fresh tensor ``node``: erase those in-place steps when
    nothing but each other reads them (``node`` itself then has no user left)."""
    steps: list[fx.Node] = []
    frontier = [node]
    while frontier:
        for user in frontier.pop().users:
            name, in_place = node_kind(user)
            if not (in_place and name in _HELPERS and user.args and user.args[0] in (node, *steps)):
                return  # something else reads the norm or its storage: keep it all
            if user not in steps:
                steps.append(user)
                frontier.append(user)
    for step in reversed(steps):  # each step was found after the step it writes through
        graph.erase_node(step)


def reject_log(rejected: list[Rejection]) -> None:
    """Count and log each loop that looked like Newton–Schulz but was left as it was."""
    for r in rejected:
        counters["canonicalize.rejected"] += 1
        log.info("canonicalize: left %s as it was: %s", r.chain.start.name, r.reason)

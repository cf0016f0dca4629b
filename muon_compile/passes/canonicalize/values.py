"""The abstract values of :mod:`.walk`, besides the loop's own (:mod:`.algebra`): what a
storage holds (a plain matrix, a norm, a folded constant, sums of squares), how a node
relates to a storage (a transpose :class:`View`), how a loop value leaves the loop
(:class:`Escape`, :class:`Updated`), and the candidate loop itself, :class:`Chain`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

from .algebra import Odd


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


def is_scalar(x: Any) -> bool:
    """A number the op can take: a Python int / float or a folded one-element tensor constant."""
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) or (isinstance(x, Const) and x.value.numel() == 1)


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


OPAQUE_VIEW = object()  # a chain value read through a view other than a transpose


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


@dataclasses.dataclass(eq=False)
class Chain:
    """One candidate Newton–Schulz loop, as the walk found it.

    The walk builds it (its lists grow, :meth:`reject` records the first reason it is not a
    loop) and :meth:`finish` ends it: from then on it is plain, read-only data, its
    collections tuples. ``steps`` holds the step polynomial of each finished iteration (the
    last step is read off the escapes by the matcher); ``reason`` says why the walk already
    knows it is not a recognisable loop (None if it does not).
    """

    id: int
    start: fx.Node  # the division by the norm
    source: fx.Node  # the node whose storage holds M (the op's input)
    norm: NormOf
    dtype: torch.dtype
    steps: Sequence[tuple[float, ...]] = dataclasses.field(default_factory=list)
    iterates: bool = False  # a Gram matrix was formed: this looks like Newton–Schulz
    members: Sequence[fx.Node] = dataclasses.field(default_factory=list)
    escapes: Sequence[Escape] = dataclasses.field(default_factory=list)
    reason: str | None = None
    # graph inputs read as constants, with their values (a dict while walking, then pairs)
    fixed: Any = dataclasses.field(default_factory=dict)
    gram: bool = False  # an iteration ended on the Gram matrix (``R <- Z R Z``): the loop iterates on it
    # iterations before which an accumulated factor multiplied X (``X <- Q X``): a set while walking
    restarts: Any = dataclasses.field(default_factory=set)

    @property
    def it(self) -> int:
        """The current iteration: the number of finished steps."""
        return len(self.steps)

    def reject(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def finish(self) -> Chain:
        """End the walk of this chain: its collections become tuples (``fixed`` of
        ``(input, value)`` pairs, ``restarts`` sorted, before a finished iteration)."""
        self.steps, self.members, self.escapes = tuple(self.steps), tuple(self.members), tuple(self.escapes)
        self.fixed = tuple(self.fixed.items())
        self.restarts = tuple(sorted(r for r in self.restarts if r < self.it))
        return self

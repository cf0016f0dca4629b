"""The abstract values the canonicaliser evaluates a torch-level graph in.

A Newton–Schulz loop only ever forms matrix polynomials of its current iterate X. With
``L = X X^T`` and ``R = X^T X``, every value it computes is one of

* ``Odd(p)``:  ``p(L) X`` (= ``X p(R)``), the shape of X, or its transpose ``X^T p(L)``;
* ``Gram(p, side)``: ``p(L)`` (side ``"L"``) or ``p(R)`` (side ``"R"``), symmetric;

where ``p`` is an ordinary polynomial, kept as its coefficient tuple (index i is the
coefficient of ``L^i``). Products and sums of such values stay in this set, so a loop
written with ``addmm``, ``@``, ``baddbmm``, ``X.mT @ X`` or ``A @ (A @ X)`` reduces to the
same polynomial, and a step ``X <- (a + b L + c L^2) X`` is read off as ``(a, b, c)``.
A value that leaves this set (a scalar added to a Gram matrix, a product of two unrelated
matrices, a cast inside the loop) is not an iteration value, and the loop is not
recognised.

A loop that iterates on the Gram matrix (``R <- Z R Z``, ``Q <- Z Q``, restarts ``X <- Q X``)
adds two more:

* ``Transfer(start, it, p)``: ``p(L_it) S_{it-1}(L_{it-1}) ... S_start(L_start)`` with ``S_k``
  the step polynomials, the factor such a loop accumulates (``Q``): ``Q X_start = p(L_it) X_it``.
  Like the Gram values it is a polynomial in ``L_start``, so it is symmetric and commutes
  with them;
* ``Identity(s)``: ``s I`` (``torch.eye``), of no chain until it is added to a Gram value.

A Gram value ``L p(L)^2`` (``Z R Z`` with ``Z = p(L)``) is the Gram matrix of the next
iterate ``p(L) X``: :func:`gram_step` reads ``p`` off it, and the walk ends the iteration
there, as it does at the product ``X_{k+1} X_{k+1}^T``.

``Odd`` also carries ``scale``, a scalar factor applied after the polynomial by plain
multiplication (``update *= s`` after the loop), so such a factor stays outside the last
step's coefficients; sums and products multiply it in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

Poly = tuple[float, ...]
ONE: Poly = (1.0,)
GRAM: Poly = (0.0, 1.0)  # L itself


def poly_trim(p: Poly) -> Poly:
    """``p`` without trailing zero coefficients (the zero polynomial is ``()``)."""
    end = len(p)
    while end and p[end - 1] == 0.0:
        end -= 1
    return tuple(p[:end])


def poly_add(p: Poly, q: Poly, alpha: float = 1.0, beta: float = 1.0) -> Poly:
    """``alpha p + beta q``."""
    n = max(len(p), len(q))
    p, q = p + (0.0,) * (n - len(p)), q + (0.0,) * (n - len(q))
    return poly_trim(tuple(alpha * a + beta * b for a, b in zip(p, q)))


def poly_mul(p: Poly, q: Poly) -> Poly:
    """``p q``."""
    out = [0.0] * max(len(p) + len(q) - 1, 0)
    for i, a in enumerate(p):
        for j, b in enumerate(q):
            out[i + j] += a * b
    return poly_trim(tuple(out))


def poly_scale(p: Poly, s: float) -> Poly:
    """``s p``."""
    return poly_trim(tuple(s * a for a in p))


@dataclasses.dataclass(frozen=True)
class Odd:
    """``scale * p(L) X_it`` of chain ``chain`` at iteration ``it`` (transposed if ``t``)."""

    chain: int
    it: int
    poly: Poly
    scale: float = 1.0
    t: bool = False

    def full(self) -> Poly:
        """The polynomial with the scale multiplied in."""
        return poly_scale(self.poly, self.scale)

    def transposed(self, flip: bool = True) -> Odd:
        return dataclasses.replace(self, t=self.t ^ flip)


@dataclasses.dataclass(frozen=True)
class Gram:
    """``p(L)`` or ``p(R)`` of chain ``chain`` at iteration ``it`` (symmetric)."""

    chain: int
    it: int
    poly: Poly
    side: str  # "L" (X X^T) or "R" (X^T X)


@dataclasses.dataclass(frozen=True)
class Transfer:
    """``p(L_it) S_{it-1}(L_{it-1}) ... S_start(L_start)`` of chain ``chain`` (see the module
    docstring): ``Transfer @ X_start = p(L_it) X_it``."""

    chain: int
    start: int
    it: int
    poly: Poly
    side: str


@dataclasses.dataclass(frozen=True)
class Identity:
    """``scale * I``: the identity matrix (``torch.eye``), of no chain."""

    scale: float = 1.0


Value = Odd | Gram | Transfer
CHAIN_VALUES = (Odd, Gram, Transfer)


def combine(u: Value | Identity, v: Value | Identity, alpha: float, beta: float) -> Value | None:
    """``alpha u + beta v``, or None when that is no iteration value."""
    if isinstance(u, Identity) and isinstance(v, Gram):
        u, v, alpha, beta = v, u, beta, alpha
    if isinstance(u, Gram) and isinstance(v, Identity):  # G + s I
        return Gram(u.chain, u.it, poly_add(u.poly, ONE, alpha, beta * v.scale), u.side)
    if type(u) is not type(v) or isinstance(u, Identity) or (u.chain, u.it) != (v.chain, v.it):
        return None
    if isinstance(u, Odd) and u.t == v.t:
        return Odd(u.chain, u.it, poly_add(u.full(), v.full(), alpha, beta), 1.0, u.t)
    if isinstance(u, Gram) and u.side == v.side:
        return Gram(u.chain, u.it, poly_add(u.poly, v.poly, alpha, beta), u.side)
    if isinstance(u, Transfer) and (u.start, u.side) == (v.start, v.side):
        return dataclasses.replace(u, poly=poly_add(u.poly, v.poly, alpha, beta))
    return None


def scaled(u: Value | Identity, s: float) -> Value | Identity:
    """``s u``."""
    if isinstance(u, (Odd, Identity)):
        return dataclasses.replace(u, scale=u.scale * s)
    return dataclasses.replace(u, poly=poly_scale(u.poly, s))


def product(u: Value, v: Value) -> Value | None:
    """``u @ v`` for two values of one iteration, or None when that is no iteration value.

    ``p(L)X @ (r(L)X)^T = (t p r)(L)`` and ``(p(L)X)^T @ r(L)X = (t p r)(R)``; a Gram
    polynomial multiplies an odd value from the side whose dimension it has.
    """
    if isinstance(u, Transfer) or isinstance(v, Transfer):
        return _transfer_product(u, v)
    chain, it = u.chain, u.it
    if v.it != it:
        return None
    if isinstance(u, Odd) and isinstance(v, Odd):
        if u.t == v.t:
            return None
        side = "R" if u.t else "L"
        return Gram(chain, it, poly_mul(GRAM, poly_mul(u.full(), v.full())), side)
    if isinstance(u, Gram) and isinstance(v, Gram):
        return Gram(chain, it, poly_mul(u.poly, v.poly), u.side) if u.side == v.side else None
    if isinstance(u, Gram) and isinstance(v, Odd):
        # p(L) @ r(L) X, or p(R) @ X^T r(L) = (r(L) X p(R))^T
        if (u.side, v.t) in (("L", False), ("R", True)):
            return Odd(chain, it, poly_mul(u.poly, v.full()), 1.0, v.t)
        return None
    if isinstance(u, Odd) and isinstance(v, Gram):
        # r(L) X @ p(R), or X^T r(L) @ p(L)
        if (u.t, v.side) in ((False, "R"), (True, "L")):
            return Odd(chain, it, poly_mul(u.full(), v.poly), 1.0, u.t)
        return None
    return None


def _transfer_product(u: Value, v: Value) -> Value | None:
    """A product with a :class:`Transfer` ``T`` of iteration ``it``: with a Gram value of
    ``it`` (same side), another ``Transfer``; applied to ``s X_start``, ``s p(L_it) X_it``."""
    transfer, other = (u, v) if isinstance(u, Transfer) else (v, u)
    if isinstance(other, Gram):
        if (other.it, other.side) != (transfer.it, transfer.side):
            return None
        return dataclasses.replace(transfer, poly=poly_mul(transfer.poly, other.poly))
    if not isinstance(other, Odd) or other.it != transfer.start or len(other.full()) != 1:
        return None
    # T @ X (T on the side of X's rows) or X^T @ T, as for a Gram value
    left = transfer is u
    if ((transfer.side, other.t) in (("L", False), ("R", True))) if left else ((other.t, transfer.side) in ((False, "R"), (True, "L"))):
        return Odd(other.chain, transfer.it, poly_scale(transfer.poly, other.full()[0]), 1.0, other.t)
    return None


def _multiple(p: Poly, q: Poly) -> float | None:
    """``s`` with ``p = s q`` (to rounding), or None."""
    if len(p) != len(q) or not q:
        return None
    pivot = max(range(len(q)), key=lambda i: abs(q[i]))
    s = p[pivot] / q[pivot]
    if any(abs(f - s * c) > 1e-12 * max(abs(f), abs(s * c)) for f, c in zip(p, q)):
        return None
    return s


def next_iterate(v: Value, step: Poly) -> Value | None:
    """``v``, a value of the iteration whose step polynomial is ``step``, as a value of the
    next one, or None: ``s * step(L) X`` is ``s * X_next``; ``s * step(L)`` (a Gram value) or
    ``s * step(L_it) T`` (a Transfer) is ``s`` times the Transfer to the next iterate."""
    if isinstance(v, Odd):
        s = _multiple(v.full(), step)
        return None if s is None else Odd(v.chain, v.it + 1, ONE, s, v.t)
    s = _multiple(v.poly, step)
    if s is None:
        return None
    start = v.start if isinstance(v, Transfer) else v.it
    return Transfer(v.chain, start, v.it + 1, (s,), v.side)


def gram_step(p: Poly, seen: Iterable[Poly] = ()) -> Poly | None:
    """``q`` (degree 1 or 2, ``q(0) > 0``) if ``p = L q(L)^2``: then ``p(L)`` is the Gram
    matrix of the next iterate ``q(L) X``. None otherwise. The square root rounds: where
    a polynomial of ``seen`` (the iteration's Gram values, ``Z``) equals ``q`` to that
    rounding, it is ``q`` as the code wrote it."""
    if len(p) not in (4, 6) or p[0] != 0.0 or p[1] <= 0.0:
        return None
    sq = p[1:]
    n = len(sq) // 2 + 1  # coefficients of q
    q = [sq[0] ** 0.5]
    for k in range(1, n):  # the coefficient of L^k in q^2 fixes q[k]
        known = sum(q[i] * q[k - i] for i in range(1, k))
        q.append((sq[k] - known) / (2 * q[0]))
    q_t = poly_trim(tuple(q))
    if len(q_t) != n:
        return None
    square = poly_mul(q_t, q_t)
    if len(square) != len(sq) or any(abs(a - b) > 1e-12 * max(abs(a), abs(b), 1e-300) for a, b in zip(square, sq)):
        return None
    return next((z for z in seen if _multiple(z, q_t) is not None and abs(_multiple(z, q_t) - 1.0) < 1e-12), q_t)

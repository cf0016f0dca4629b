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

``Odd`` also carries ``scale``, a scalar factor applied after the polynomial by plain
multiplication (``update *= s`` after the loop), so such a factor stays outside the last
step's coefficients; sums and products multiply it in.
"""

from __future__ import annotations

import dataclasses

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


Value = Odd | Gram


def combine(u: Value, v: Value, alpha: float, beta: float) -> Value | None:
    """``alpha u + beta v``, or None when that is no iteration value."""
    if isinstance(u, Odd) and isinstance(v, Odd) and u.t == v.t:
        return Odd(u.chain, u.it, poly_add(u.full(), v.full(), alpha, beta), 1.0, u.t)
    if isinstance(u, Gram) and isinstance(v, Gram) and u.side == v.side:
        return Gram(u.chain, u.it, poly_add(u.poly, v.poly, alpha, beta), u.side)
    return None


def scaled(u: Value, s: float) -> Value:
    """``s u``."""
    if isinstance(u, Odd):
        return dataclasses.replace(u, scale=u.scale * s)
    return dataclasses.replace(u, poly=poly_scale(u.poly, s))


def product(u: Value, v: Value) -> Value | None:
    """``u @ v`` for two values of one iteration, or None when that is no iteration value.

    ``p(L)X @ (r(L)X)^T = (t p r)(L)`` and ``(p(L)X)^T @ r(L)X = (t p r)(R)``; a Gram
    polynomial multiplies an odd value from the side whose dimension it has.
    """
    chain, it = u.chain, u.it
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


def next_iterate(v: Value, step: Poly) -> Odd | None:
    """``v``, a value of the iteration whose step polynomial is ``step``, as a value of the
    next one: ``s * step(L) X`` is ``s * X_next``; anything else is no value of the next iteration."""
    if not isinstance(v, Odd):
        return None
    full = v.full()
    if len(full) != len(step) or not step:
        return None
    pivot = max(range(len(step)), key=lambda i: abs(step[i]))
    s = full[pivot] / step[pivot]
    if any(abs(f - s * c) > 1e-12 * max(abs(f), abs(s * c)) for f, c in zip(full, step)):
        return None
    return Odd(v.chain, v.it + 1, ONE, s, v.t)

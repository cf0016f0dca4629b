"""canonicalize's algebra (muon_compile/passes/canonicalize/algebra.py) on its own: the polynomials,
the values of one Newton–Schulz iteration and how a step is read off them, without a graph.

Each algebraic claim is also checked numerically: the value a polynomial stands for, evaluated
in float64 on a random matrix, against the matrix products it abstracts."""

import pytest
import torch

from muon_compile.passes.canonicalize.algebra import (
    GRAM,
    ONE,
    Gram,
    Identity,
    Odd,
    Transfer,
    combine,
    gram_step,
    next_iterate,
    poly_add,
    poly_mul,
    poly_trim,
    product,
    scaled,
)

A, B, C = 3.4445, -4.7750, 2.0315  # Keller Jordan's step


def evaluate(value, x):
    """The matrix ``value`` stands for, for the iterate ``x`` (float64)."""
    gram = x @ x.mT if getattr(value, "side", "L") == "L" else x.mT @ x
    poly = value.full() if isinstance(value, Odd) else value.poly
    p = sum(c * torch.linalg.matrix_power(gram, i) for i, c in enumerate(poly))
    if isinstance(value, Gram):
        return p
    if isinstance(value, Odd):
        return p @ x if not value.t else (p @ x).mT
    raise TypeError(value)


@pytest.fixture
def x():
    return torch.randn(6, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) / 4


def test_polynomials_add_multiply_and_trim():
    assert poly_add((1.0, 2.0), (0.0, 0.0, 3.0), 2.0, -1.0) == (2.0, 4.0, -3.0)
    assert poly_mul((1.0, 1.0), (1.0, -1.0)) == (1.0, 0.0, -1.0)  # (1 + L)(1 - L)
    assert poly_trim((1.0, 2.0, 0.0, 0.0)) == (1.0, 2.0)


def test_a_textbook_step_reads_off_as_its_coefficients(x):
    """``G = X X^T; B = b G + c G G; X' = a X + B X``: the step ``(a, b, c)``."""
    it = Odd(0, 0, ONE)
    gram = product(it, it.transposed())
    assert gram == Gram(0, 0, GRAM, "L")
    bmat = combine(gram, product(gram, gram), B, C)
    step = combine(it, product(bmat, it), A, 1.0)
    assert isinstance(step, Odd) and step.full() == pytest.approx((A, B, C))
    g = x @ x.mT
    torch.testing.assert_close(evaluate(step, x), A * x + (B * g + C * g @ g) @ x, rtol=1e-12, atol=0)


def test_the_transposed_form_is_the_same_step(x):
    """``A = X^T X`` on the right: ``X' = a X + X (b A + c A A)``, X^T oriented values too."""
    it = Odd(0, 0, ONE)
    right = product(it.transposed(), it)
    assert right.side == "R"
    step = combine(it, product(it, combine(right, product(right, right), B, C)), A, 1.0)
    assert step.full() == pytest.approx((A, B, C)) and not step.t
    assert product(it, it) is None  # X X: no iteration value
    assert product(right, Gram(0, 0, GRAM, "L")) is None  # two sides never multiply


def test_values_of_different_iterations_or_orientations_never_combine():
    it0, it1 = Odd(0, 0, ONE), Odd(0, 1, ONE)
    assert combine(it0, it1, 1.0, 1.0) is None
    assert combine(it0, it0.transposed(), 1.0, 1.0) is None
    assert product(Gram(0, 0, GRAM, "L"), it1) is None
    assert combine(Odd(1, 0, ONE), it0, 1.0, 1.0) is None  # another chain


def test_a_scale_stays_outside_the_polynomial_and_multiplies_in():
    v = scaled(Odd(0, 0, (A, B, C)), 0.5)
    assert v.poly == (A, B, C) and v.scale == 0.5 and v.full() == pytest.approx((A / 2, B / 2, C / 2))
    assert scaled(Identity(), 3.0) == Identity(3.0)
    assert scaled(Gram(0, 0, GRAM, "L"), 2.0).poly == (0.0, 2.0)


def test_the_identity_added_to_a_gram_value(x):
    """``G + 2 I`` (HeavyBall's diagonal add): the polynomial ``2 + L``."""
    shifted = combine(Gram(0, 0, GRAM, "L"), Identity(2.0), 1.0, 1.0)
    assert shifted.poly == (2.0, 1.0)
    torch.testing.assert_close(evaluate(shifted, x), x @ x.mT + 2 * torch.eye(6, dtype=torch.float64), rtol=1e-12, atol=0)


def test_next_iterate_is_the_step_times_a_scale():
    step = (A, B, C)
    assert next_iterate(Odd(0, 0, step), step) == Odd(0, 1, ONE, 1.0)
    assert next_iterate(Odd(0, 0, step, 2.0, True), step) == Odd(0, 1, ONE, 2.0, True)
    assert next_iterate(Odd(0, 0, (A, B, 0.0)), step) is None  # another polynomial: an intermediate
    assert next_iterate(Gram(0, 0, step, "L"), step) == Transfer(0, 0, 1, (1.0,), "L")


def test_gram_step_finds_the_next_gram_matrix(x):
    """``L q(L)^2`` is the Gram matrix of ``q(L) X``: ``q`` is read back, to rounding, and a
    polynomial the code formed that equals it is preferred."""
    q = (A, B, C)
    p = poly_mul(GRAM, poly_mul(q, q))
    assert gram_step(p) == pytest.approx(q, rel=1e-12)
    assert gram_step(p, seen=[q]) == q
    nxt = Gram(0, 0, p, "L")
    x1 = evaluate(Odd(0, 0, q), x)
    torch.testing.assert_close(evaluate(nxt, x), x1 @ x1.mT, rtol=1e-10, atol=0)
    assert gram_step((0.0, 1.0, 1.0)) is None  # L + L^2 is no square's multiple
    assert gram_step((1.0, *p[1:])) is None  # a constant term: not L times anything

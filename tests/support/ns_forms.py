"""Newton–Schulz loops as people write them (the canonicalize pass must recognise these),
and near misses that it must leave alone. Each takes a list of matrices and returns
their orthogonalised versions, like an optimizer step's inner loop."""

import torch

from muon_compile.ns.coefficients import PRESETS

KELLER = (3.4445, -4.7750, 2.0315)
POLAR = PRESETS["polar_express"].coefficients  # per-iteration, safety-damped
POLAR_SAFETY = 1.01


def keller(G, steps=5, dtype=torch.bfloat16, eps=1e-7):
    """Keller Jordan's ``zeropower_via_newtonschulz5``: matmul form, norm plus eps, 2-D or batched."""
    a, b, c = KELLER
    X = G.to(dtype)
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def polar_express(G, steps=5, dtype=torch.bfloat16):
    """Polar Express as in nanochat: per-iteration coefficients, a safety factor in the
    normalisation, and a tall branch that multiplies from the right (``X.mT @ X``)."""
    X = G.to(dtype)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * POLAR_SAFETY + 1e-7)
    tall = G.size(-2) > G.size(-1)
    for a, b, c in POLAR[:steps]:  # steps <= 8 here
        if tall:
            A = X.mT @ X
            B = b * A + c * (A @ A)
            X = a * X + X @ B
        else:
            A = X @ X.mT
            B = b * A + c * (A @ A)
            X = a * X + B @ X
    return X


def addmm_clamped(G, steps=5, dtype=torch.bfloat16, eps=1e-7):
    """torch.optim.Muon's 2-D form (addmm, ``.T``, in-place division by a clamped norm),
    with baddbmm for a batch; the update is scaled in place afterwards (Keller's Muon)."""
    a, b, c = KELLER
    X = G.to(dtype, copy=True)
    if G.size(-2) > G.size(-1):
        X = X.mT
    X.div_(torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True).clamp_min(eps))
    mm = torch.addmm if X.dim() == 2 else torch.baddbmm
    for _ in range(steps):
        A = X @ X.mT
        B = mm(A, A, A, beta=b, alpha=c)
        X = mm(X, B, X, beta=a)
    if G.size(-2) > G.size(-1):
        X = X.mT
    X *= max(1, G.size(-2) / G.size(-1)) ** 0.5
    return X


def cubic(G, steps=5, dtype=torch.float32):
    """The classic cubic iteration ``X <- 1.5 X - 0.5 X X^T X`` (degree 1 in X X^T), no transposition."""
    X = G.to(dtype)
    X = X / torch.linalg.matrix_norm(X, keepdim=True)
    for _ in range(steps):
        X = 1.5 * X - 0.5 * (X @ X.mT) @ X
    return X


def spelled_out_norm(G, steps=5, dtype=torch.bfloat16, eps=1e-7):
    """The Frobenius norm written as a sum of squares (``X * X``, summed over the matrix
    dims, square-rooted), scaled and offset in place on the norm tensor, then ``X.div_(n)``."""
    a, b, c = KELLER
    X = G.to(dtype, copy=True)
    n = (X * X).sum(dim=(-2, -1), keepdim=True).sqrt()
    n.mul_(POLAR_SAFETY).add_(eps)
    X.div_(n)
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return X


def reciprocal_of_clamped_norm(G, steps=5, dtype=torch.bfloat16, eps=1e-7, in_place=False):
    """A multiplication by the reciprocal of ``linalg.norm`` clamped at eps (``clamp(min=)``,
    or in place, ``clamp_(min=)``: DTensor has no in-place clamp of a norm's partial value,
    so that spelling runs on one device only)."""
    a, b, c = KELLER
    X = G.to(dtype)
    n = torch.linalg.norm(X, dim=(-2, -1), keepdim=True)
    X = X * (n.clamp_(min=eps) if in_place else n.clamp(min=eps)).reciprocal()
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return X


def rsqrt_of_squares(G, steps=5, dtype=torch.bfloat16):
    """``X * rsqrt(sum of X ** 2)``: the norm's reciprocal in one call, no eps."""
    a, b, c = KELLER
    X = G.to(dtype)
    X = X * torch.rsqrt(X.pow(2).sum(dim=(-2, -1), keepdim=True))
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return X


def two_divisions(G, steps=5, dtype=torch.bfloat16, eps=1e-7):
    """The normalisation as two divisions: by the norm clamped at eps, then by a safety
    factor (Polar Express's damping written apart)."""
    a, b, c = KELLER
    X = G.to(dtype)
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    X = X / POLAR_SAFETY
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return X


def reciprocal_of_norm_clamped_in_place(G, steps=5, dtype=torch.bfloat16):
    return reciprocal_of_clamped_norm(G, steps, dtype, in_place=True)


def identity_by_diagonal(G, steps=5, dtype=torch.bfloat16):
    """Each step as ``(a I + (b I + c S) S) X`` with ``S = X X^T``, the identity terms added
    on the diagonal in place."""
    a, b, c = KELLER
    X = G.to(dtype)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        S = X @ X.mT
        Y = c * S
        Y.diagonal(dim1=-2, dim2=-1).add_(b)
        Y = Y @ S
        Y.diagonal(dim1=-2, dim2=-1).add_(a)
        X = Y @ X
    return X


def scaled_in_place_after(G, steps=5, dtype=torch.bfloat16):
    """The result rescaled in place after the loop, row by row (NorMuon's variance
    reduction), then read again through the loop's own variable."""
    a, b, c = KELLER
    X = G.to(dtype)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    row_moment = X.float().square().mean(dim=-1, keepdim=True)
    X.mul_(row_moment.add(1e-10).rsqrt().to(X.dtype))
    return X


def stochastic_rounded(G, steps=3, dtype=torch.bfloat16, normalise=True):
    """Normalised in fp32, then rounded to ``dtype`` stochastically through its bits (random
    low bits added, then masked off, HeavyBall's way): a cast the walk cannot read, so the op
    takes the rounded matrix as it is (``normalize=False``)."""
    X = G.float()
    if normalise:
        X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    if dtype != torch.bfloat16:  # as HeavyBall: only a rounding to bf16 is random
        return _keller_steps(X.to(dtype), steps)
    bits = X.view(torch.int32)
    noise = torch.randint_like(bits, 0, 1 << 16)
    X = ((bits + noise) & -65536).view(torch.float32).to(dtype)
    return _keller_steps(X, steps)


def gram_with_restart(G, steps=5, dtype=torch.bfloat16, restart=2):
    """The iteration carried out on the Gram matrix ``R = X X^T`` (the shape of DeePMD-kit's and
    DeepSpeed's Gram loops): ``Z = a I + b R + c R^2`` with ``I`` from ``torch.eye``, the factors
    gathered in ``Q`` (``Q <- Q Z``), ``R <- Z R Z`` in between, ``X <- Q X`` once before
    iteration ``restart`` and at the end; Polar Express' per-iteration coefficients."""
    X = G.to(dtype)
    tall = G.size(-2) > G.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    eye = torch.eye(X.size(-2), dtype=dtype, device=X.device)
    R = X @ X.mT
    Q = None
    for i, (a, b, c) in enumerate(POLAR[:steps]):
        if i == restart:
            X = Q @ X
            R = X @ X.mT
            Q = None
        Z = a * eye + b * R + c * (R @ R)
        Q = Z if Q is None else Q @ Z
        if i + 1 < steps and i + 1 != restart:
            R = Z @ (R @ Z)
    X = Q @ X
    return X.mT if tall else X


FORMS = {
    "keller": keller, "polar_express": polar_express, "addmm_clamped": addmm_clamped, "cubic": cubic,
    "spelled_out_norm": spelled_out_norm, "reciprocal_of_clamped_norm": reciprocal_of_clamped_norm,
    "rsqrt_of_squares": rsqrt_of_squares, "two_divisions": two_divisions,
}
# recognised too, but DTensor itself cannot run them: tested on one device only
SINGLE_DEVICE_FORMS = {
    **FORMS, "reciprocal_of_norm_clamped_in_place": reciprocal_of_norm_clamped_in_place,
    # on one device only, to spare CI a world-2 compile each
    "scaled_in_place_after": scaled_in_place_after, "identity_by_diagonal": identity_by_diagonal,
    "gram_with_restart": gram_with_restart, "stochastic_rounded": stochastic_rounded,
}


class TensorSettings:
    """Hyper-parameters kept as tensors on an object, so they reach the graph as inputs:
    eps, the norm scale and the (a, b, c) table are loop constants (compiled in, checked
    each step); ``lr`` only scales the result, so it stays an input and may change.
    ``table``: the coefficients as one ``(a, b, c)`` row per iteration (``steps`` rows)."""

    def __init__(self, device="cpu", table=False, steps=3):
        self.eps = torch.tensor(1e-7, device=device)
        self.norm_scale = torch.tensor(1.01, device=device)
        self.abc = torch.tensor([KELLER] * steps if table else KELLER, device=device)
        self.lr = torch.tensor(0.02, device=device)
        self.table, self.steps = table, steps

    def __call__(self, G, dtype=torch.bfloat16):
        X = G.to(dtype)
        X = X / (X.norm(dim=(-2, -1), keepdim=True) * self.norm_scale + self.eps)
        for i in range(self.steps):
            a, b, c = self.abc[i] if self.table else self.abc
            A = X @ X.mT
            X = a * X + (b * A + c * A @ A) @ X
        return X * self.lr


# ---------------------------------------------------------------- near misses

def _keller_steps(X, steps):
    a, b, c = KELLER
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return X


def septic(G, steps=3, dtype=torch.float32):
    """A degree-3 polynomial in X X^T per step: not the op's quintic."""
    X = G.to(dtype)
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = 2.0 * A - 1.5 * A @ A + 0.4 * A @ A @ A
        X = 1.2 * X + B @ X
    return X


def spectral_norm(G, steps=3, dtype=torch.float32):
    """Normalised by the spectral norm, not the Frobenius norm."""
    X = G.to(dtype)
    X = X / (torch.linalg.matrix_norm(X, ord=2) + 1e-7)
    return _keller_steps(X, steps)


def leaks_intermediate(G, steps=3, dtype=torch.float32):
    """The first iterate is used after the loop (added to the result)."""
    a, b, c = KELLER
    X = G.to(dtype)
    X = X / (X.norm() + 1e-7)
    first = None
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
        first = X if first is None else first
    return X + 0.5 * first


def whole_stack_norm(G, steps=3, dtype=torch.float32):
    """A batch divided by the norm of the whole stack, not of each matrix."""
    X = G.to(dtype)
    X = X / (X.norm() + 1e-7)
    return _keller_steps(X, steps)


def shifted_gram(G, steps=3, dtype=torch.float32):
    """A scalar added to every entry of the Gram matrix (not a multiple of I)."""
    a, b, c = KELLER
    X = G.to(dtype)
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.mT + 0.01
        X = a * X + (b * A + c * A @ A) @ X
    return X


def foreign_norm(G, steps=3, dtype=torch.float32):
    """Divided by the norm of another tensor."""
    X = G.to(dtype)
    X = X / (torch.tanh(G).norm() + 1e-7)
    return _keller_steps(X, steps)


def eps_under_the_root(G, steps=3, dtype=torch.float32):
    """``X * rsqrt(||X||^2 + eps)``: eps inside the square root, which the op does not express."""
    X = G.to(dtype)
    X = X * torch.rsqrt(X.square().sum() + 1e-7)
    return _keller_steps(X, steps)


# near miss -> (input shapes, the reason the pass must give)
def divided_again_but_read_undivided(G, steps=2, dtype=torch.bfloat16):
    """:func:`two_divisions`, but the iteration also reads the matrix from before its second
    division: that division is no part of the norm."""
    a, b, c = KELLER
    X = G.to(dtype)
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=1e-7)
    Y = X / POLAR_SAFETY
    for _ in range(steps):
        A = Y @ Y.mT
        Y = a * X + (b * A + c * A @ A) @ Y
    return Y


def updated_in_place_beside_a_copy(G, steps=2, dtype=torch.bfloat16):
    """:func:`scaled_in_place_after`, but a copy of the result is read too: the op's one
    result cannot both take the update and stay as it was."""
    X = G.to(dtype)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    X = _keller_steps(X, steps)
    kept = X.clone()
    X.mul_(0.5 + X.float().abs().mean().to(X.dtype))
    return X + kept


def shifted_diagonal(G, steps=2, dtype=torch.float32):
    """:func:`identity_by_diagonal`, but added one place off the diagonal: no multiple of I."""
    a, b, c = KELLER
    X = G.to(dtype)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        S = X @ X.mT
        Y = c * S
        Y.diagonal(1).add_(b)
        X = a * X + (Y @ S) @ X
    return X


def gram_missing_a_factor(G, steps=3, dtype=torch.float32):
    """:func:`gram_with_restart` without restart, but ``R <- Z R``: no Gram matrix of an iterate."""
    X = G.to(dtype)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    eye = torch.eye(X.size(-2), dtype=dtype)
    R = X @ X.mT
    Q = None
    for a, b, c in POLAR[:steps]:
        Z = a * eye + b * R + c * (R @ R)
        Q = Z if Q is None else Q @ Z
        R = Z @ R
    return Q @ X


NEAR_MISSES = {
    septic: ([(8, 12)], "degree 3"),
    spectral_norm: ([(8, 12)], "not the Frobenius norm"),
    leaks_intermediate: ([(8, 12)], "intermediate"),
    divided_again_but_read_undivided: ([(8, 12)], "degree 0"),
    whole_stack_norm: ([(2, 8, 12)], "not each matrix"),
    shifted_gram: ([(8, 12)], "outside the iteration"),
    foreign_norm: ([(8, 12)], "norm of another tensor"),
    eps_under_the_root: ([(8, 12)], "under the square root"),
    updated_in_place_beside_a_copy: ([(8, 12)], "while another copy of it is read"),
    shifted_diagonal: ([(8, 12)], "is read by diagonal, outside the iteration"),
    gram_missing_a_factor: ([(8, 12)], "the last step is a polynomial of degree 26"),
}


# ------------------------------------------------- torch.optim.Muon's exact reference

def _torch_muon_ns_fp64(grad, ns_coefficients, ns_steps, eps):
    """torch.optim.Muon's ``_zeropower_via_newtonschulz`` step for step, in fp64 instead of bf16."""
    a, b, c = ns_coefficients
    X = grad.double()
    if grad.size(0) > grad.size(1):
        X = X.T
    X = X / X.norm().clamp(min=eps)
    for _ in range(ns_steps):
        A = X @ X.T
        X = torch.addmm(X, torch.addmm(A, A, A, beta=b, alpha=c), X, beta=a)
    if grad.size(0) > grad.size(1):
        X = X.T
    return X.to(grad.dtype)


def exact_torch_muon():
    """A context in which eager torch.optim.Muon computes its Newton–Schulz in fp64."""
    from unittest import mock

    return mock.patch.object(torch.optim._muon, "_zeropower_via_newtonschulz", _torch_muon_ns_fp64)


# Loops the walk starts no candidate for: the explanation still names them (passes/canonicalize/near_miss.py).
def rounded_unnormalised(G, steps=3, dtype=torch.bfloat16):
    """:func:`stochastic_rounded` of a matrix never divided by a norm."""
    return stochastic_rounded(G, steps, dtype, normalise=False)


def unnormalised(G, steps=3, dtype=torch.float32):
    """Iterated on the matrix as given, never divided by a norm."""
    return _keller_steps(G.to(dtype), steps)


# unseen loop -> (input shapes, the reason the explanation must give)
UNSEEN = {
    rounded_unnormalised: ([(8, 12)], "integer values"),
    unnormalised: ([(8, 12)], "not divided by a norm"),
}

"""The Newton–Schulz math, pure and tiny: the op's eager implementation and the
function the ``lower`` pass traces into the graph, so both compute the same thing. It
reads no configuration: everything it depends on is an argument."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..kernels.sym import sym_bmm
from .args import AUTO, GRAM, NSArgs
from .cost import (
    BMM,
    EPILOGUE,
    NATIVE,
    PRODUCT_POLICIES,
    SYMMETRIC,
    WIDE,
    choose,
    choose_epilogue,
    choose_orientation,
    choose_products,
    iteration_dtype,
    segments,
)
from ..compile.compat import CPU_FUSION_DROPS_ROUND_TRIP
from .rounding_cast import opaque_cast, to_low_precision


def algorithm_for(x: Tensor, args: NSArgs, policy: str = AUTO) -> str:
    """The concrete algorithm :func:`orthogonalize` runs on ``x``: ``args.algorithm``, or
    for ``auto`` :func:`muon_compile.ns.cost.choose` under ``policy`` (the op passes
    ``MUON_COMPILE_NS_ALGORITHM``'s)."""
    if args.algorithm != AUTO:
        return args.algorithm
    rows, cols = x.shape[-2:]
    return choose(rows, cols, args.steps, args.compute_dtype, x.device.type, policy=policy).algorithm


def orthogonalize(
    x: Tensor,
    args: NSArgs,
    policy: str = AUTO,
    products: str = AUTO,
    epilogue: str = AUTO,
    *,
    orientation: str = AUTO,
    eager: bool = False,
) -> Tensor:
    """Approximate the orthogonal polar factor of each matrix in ``x`` (2-D, or 3-D batched).

    1. A tall matrix (rows > cols) is read as its transpose so the Gram matrix is the small
       one. In the textbook iteration it is also kept in its own (tall) memory layout where
       ``orientation`` (the plan's :func:`muon_compile.ns.cost.choose_orientation`, or a policy of
       ``MUON_COMPILE_NS_ORIENTATION`` resolved for ``x``'s shape and device) is
       :data:`~muon_compile.ns.cost.NATIVE`: every product that
       forms a new iterate, ``P X``, is computed as ``(X^T P^T)^T``, written tall, so neither
       the input nor the result is transposed in memory; else (``transposed``) the iterates
       are written wide and the result transposed back.
    2. ``X = x.to(compute_dtype)`` (the reference code's first step; casting commutes
       with stacking, transposing and zero-padding, so a batch of compute-dtype copies
       gives exactly the per-matrix result; :func:`to_low_precision` keeps this rounding
       where a torch version's fusion would drop it), then ``X0 = X / (||X||_F * norm_scale + eps)``
       (or ``/ max(||X||_F * norm_scale, eps)`` when ``clamp_eps``), evaluated in at
       least fp32 and, for the textbook iteration, rounded once to ``compute_dtype``
       (``X0 = X`` without ``args.normalize``: an input normalised by the caller).
    3. The iteration, by the algorithm :func:`algorithm_for` names (``auto`` resolved
       under ``policy``):

       * ``textbook``, for each iteration's ``(a, b, c)``, in one of two forms
         (``epilogue``: the plan's :func:`muon_compile.ns.cost.choose_epilogue`, or a
         policy of ``MUON_COMPILE_NS_EPILOGUE``, ``auto`` / ``on`` / ``off``, resolved for
         ``x``'s shape and device):

         - ``epilogue``: ``A = X X^T; B = b A + c A A; X = a X + B X``, the scalars in the
           products' ``beta`` / ``alpha`` (``baddbmm``): three matmul kernels and no
           pointwise kernel between them (the same code for every iteration of a bucket
           up to the scalars, which the generated code passes as arguments). The products
           accumulate in fp32 and round once to ``compute_dtype``, epilogue included. A
           CPU ``baddbmm`` first copies its input into its output: a pass over ``X``.
         - ``polynomial``: ``A = X X^T; B = c A A + b A + a I; X = B X``: three plain
           products and one small (rows x rows) pointwise kernel forming ``B``, summed in
           at least fp32 and rounded once (:func:`polynomial`; ``eager``, the op's eager
           kernel: formed in place and, with plain products, every iteration written into
           buffers allocated once, :func:`polynomial_in_buffers`, with the same roundings; traced
           on the CPU, ``a`` added on the diagonal alone, :func:`traced_identity`). In low precision the
           diagonal ``a + B_ii`` rounds relative to its own size, the size of the output
           it scales, so the rounding error matches ``a X + B X`` rounded once.
       * ``gram`` (:func:`gram_iteration`): the same polynomial on the Gram matrix, the
         result rounded once to ``compute_dtype``.

       ``products`` (the plan's choice, :func:`muon_compile.ns.cost.choose_products`; a
       policy, ``auto`` by default, is resolved for ``x``'s shape and device as that does):
       ``sym`` forms the symmetric products (``X X^T``, ``A A``, ``R R``) with
       :func:`muon_compile.kernels.sym.sym_bmm`, in the epilogue form the textbook ``B``
       with the same epilogue (one rounding); :data:`~muon_compile.ns.cost.WIDE` forms every
       product in fp32 on the iteration dtype's values and rounds it back (:func:`_widened`):
       where the device's low-precision products are the slower.

    4. Transpose back; the result has ``x``'s shape, dtype and a contiguous layout.
    """
    batch = x if x.dim() == 3 else x.unsqueeze(0)
    tall = batch.size(-2) > batch.size(-1)
    if tall:
        batch = batch.mT
    compute_dtype = args.compute_dtype
    acc = torch.promote_types(compute_dtype, torch.float32)
    X, norm, denom = normalized(batch, args, eager=eager)
    algorithm = algorithm_for(X, args, policy)
    if products in PRODUCT_POLICIES:
        products = choose_products(X.size(-2), X.size(-1), algorithm, compute_dtype, X.device.type, products).kind
    if algorithm == GRAM:
        X = gram_iteration(X, args, acc, norm / args.norm_scale / denom, products)
    else:
        X = X.to(compute_dtype)
        symmetric = _symmetric(products)
        if epilogue in PRODUCT_POLICIES:
            epilogue = choose_epilogue(X.size(-2), X.size(-1), compute_dtype, X.device.type, epilogue).kind
        polynomial_form = epilogue != EPILOGUE
        if tall and orientation in PRODUCT_POLICIES:
            orientation = choose_orientation(X.size(-1), X.size(-2), compute_dtype, X.device.type, orientation).kind
        native = tall and orientation == NATIVE
        eye = traced_identity(X.size(-2), X.device, acc) if polynomial_form and not eager else None
        if polynomial_form and eager and products == BMM:
            return _finish(polynomial_in_buffers(X, args.coefficients, acc, compute_dtype, native), x, tall)
        for a, b, c in args.coefficients:
            A = symmetric(X, X.mT)
            if polynomial_form:
                X = _times(polynomial(A, symmetric(A, A), (a, b, c), acc, compute_dtype, eye), X, native, products)
            else:
                update = _formed(torch.baddbmm, products)
                B = sym_bmm(A, A, A, beta=b, alpha=c) if products == SYMMETRIC else update(A, A, A, beta=b, alpha=c)
                X = update(X.mT, X.mT, B.mT, beta=a).mT if native else update(X, B, X, beta=a)
    return _finish(X, x, tall)


def _times(P: Tensor, X: Tensor, native: bool, products: str) -> Tensor:
    """``P X``, written in ``X``'s tall memory layout (as ``(X^T P^T)^T``) where ``native``."""
    bmm = _formed(torch.bmm, products)
    return bmm(X.mT, P.mT).mT if native else bmm(P, X)


def _upcast(t: Tensor) -> Tensor:
    """``t`` (bf16 or fp16) in fp32, every value exactly its stored one: where Inductor's CPU
    fusion drops a round trip (:data:`~muon_compile.compile.compat.CPU_FUSION_DROPS_ROUND_TRIP`),
    a kernel of its own reading ``t`` back, so a fused producer cannot hand over its unrounded value."""
    if CPU_FUSION_DROPS_ROUND_TRIP and t.device.type == "cpu":
        return opaque_cast(t, torch.float32)
    return t.to(torch.float32)


def _widened(product):  # noqa: ANN001, ANN202
    """``product`` (``torch.bmm`` or ``torch.baddbmm``) formed in fp32 on its operands' values
    and rounded back to their dtype: the products of two bf16 or fp16 numbers are exact in fp32
    and a low-precision product accumulates in fp32, so this is that product up to the order
    of its sums, at the device's fp32 rate (:data:`~muon_compile.ns.cost.WIDE`)."""

    def formed(*operands: Tensor, **scalars: float) -> Tensor:
        return to_low_precision(product(*map(_upcast, operands), **scalars), operands[0].dtype)

    return formed


_WIDENED = {torch.bmm: _widened(torch.bmm), torch.baddbmm: _widened(torch.baddbmm)}


def _formed(product, products: str):  # noqa: ANN001, ANN202
    """``product`` (``torch.bmm`` or ``torch.baddbmm``) as ``products`` forms it: itself, or
    widened (:func:`_widened`)."""
    return _WIDENED[product] if products == WIDE else product


def _finish(X: Tensor, x: Tensor, tall: bool) -> Tensor:
    """Step 4 of :func:`orthogonalize`: ``X`` transposed back where ``x`` was tall, in ``x``'s
    shape, dtype and a contiguous layout."""
    if tall:
        X = X.mT
    if x.dim() == 2:
        X = X.squeeze(0)
    return X.to(x.dtype).contiguous()


def polynomial_in_buffers(
    X: Tensor, coefficients: Sequence[tuple[float, float, float]], acc: torch.dtype, dtype: torch.dtype, native: bool = False
) -> Tensor:
    """The polynomial form's iterations on ``X`` (in ``dtype``) as the op's eager implementation runs
    them: the operations of :func:`orthogonalize`'s loop (``bmm``, :func:`polynomial` in place),
    each writing into buffers allocated once a call instead of a fresh tensor an operation:
    on the CPU a fresh buffer of this size costs its page faults (2026-12-07, this 2-core VM,
    ``[8, 2048, 2048]`` bf16: a product 103.5 ms into a fresh tensor against 69.7 ms into a
    buffer, a cast to fp32 35.8 against 9.5 ms). ``X`` itself is not written. ``native``: the
    iterates written tall, as :func:`orthogonalize`'s ``orientation`` says."""
    batch, m, n = X.shape
    A, AA, B = (X.new_empty(batch, m, m) for _ in range(3))
    work = (X.new_empty(batch, m, m, dtype=acc), X.new_empty(batch, m, m, dtype=acc), B)
    shape = (batch, n, m) if native else (batch, m, n)
    iterates = (X.new_empty(shape), X.new_empty(shape))  # contiguous, as a product's result is
    for i, (a, b, c) in enumerate(coefficients):
        torch.bmm(X, X.mT, out=A)
        torch.bmm(A, A, out=AA)
        P = polynomial(A, AA, (a, b, c), acc, dtype, None, work)
        X = torch.bmm(X.mT, P.mT, out=iterates[i % 2]).mT if native else torch.bmm(P, X, out=iterates[i % 2])
    return X


def normalized(batch: Tensor, args: NSArgs, *, eager: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Step 2 of :func:`orthogonalize` on a batch of wide matrices: ``X0`` in at least fp32,
    with the norms (``||X||_F * norm_scale``, ``[batch, 1, 1]``) and the denominators
    (``norm + eps``, or ``max(norm, eps)`` when ``clamp_eps``) it was divided by; without
    ``args.normalize``, ``X`` as given, its norms, and denominators of 1. ``eager`` (the op's
    eager implementation): the norms as :func:`frobenius_norm` takes them eagerly, and where the cast
    made ``X`` a copy (a low-precision compute dtype), the division in place."""
    acc = torch.promote_types(args.compute_dtype, torch.float32)
    X = to_low_precision(batch, args.compute_dtype).to(acc)
    norm = frobenius_norm(X, eager=eager)
    if not args.normalize:
        return X, norm, torch.ones_like(norm)
    if args.norm_scale != 1.0:
        norm = norm * args.norm_scale
    denom = norm.clamp_min(args.eps) if args.clamp_eps else norm + args.eps
    copied = args.compute_dtype != acc  # X is to_low_precision's result cast up: this call's own
    return (X.div_(denom) if eager and copied else X / denom), norm, denom


# A norm below 2^-60 (of a matrix whose entries' squares leave fp32's normal range, around
# 1e-19: a momentum decayed for a thousand steps) is taken again of the matrix times 2^100
# (its entries then below 2^40, the squares of fp32's smallest ones above 2^-98); one above
# 2^60 (squares past fp32's largest from entries around 1e19) of the matrix times 2^-100
_LARGE_NORM = 2.0**60
_RESCALE = 2.0**100


def frobenius_norm(X: Tensor, *, eager: bool = False) -> Tensor:
    """The Frobenius norms of a batch ``X`` (``[batch, 1, 1]``), in fp32 also where the
    squares of its entries leave fp32's range (taken of ``X`` scaled by ``2^100`` or
    ``2^-100`` where the plain norm is below ``2^-60`` or above ``2^60``: exact scalings;
    the three reductions read ``X`` in one pass when compiled). The normalisation divides
    by them; the Gram iteration takes its input in units of them. ``eager`` on the CPU (the
    op's eager implementation), where no device waits for the host: the scaled norms only where a
    plain one is out of that range (the same values: elsewhere the selection takes the plain
    norm), not two scaled copies of ``X`` and their reductions every call."""
    norm = torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True)
    if eager and X.device.type == "cpu" and bool(((norm >= 1 / _LARGE_NORM) & (norm <= _LARGE_NORM)).all()):
        return norm
    small = torch.linalg.vector_norm(X * _RESCALE, dim=(-2, -1), keepdim=True) / _RESCALE
    large = torch.linalg.vector_norm(X / _RESCALE, dim=(-2, -1), keepdim=True) * _RESCALE
    return torch.where(norm < 1 / _LARGE_NORM, small, torch.where(norm > _LARGE_NORM, large, norm))


def polynomial(
    A: Tensor,
    AA: Tensor,
    coefficients: tuple[float, float, float],
    acc: torch.dtype,
    dtype: torch.dtype,
    eye: Tensor | str | None,
    work: tuple[Tensor, Tensor, Tensor] | None = None,
) -> Tensor:
    """The textbook iteration's pointwise step ``B = c A A + b A + a I`` of its polynomial
    form, summed in ``acc`` (at least fp32) and rounded once to ``dtype``; ``AA`` is the
    product ``A A``. ``eye`` says how ``a I`` is added (:func:`traced_identity`):

    * the identity in ``acc`` (traced): as written, one fused kernel;
    * :data:`DIAGONAL` (traced): ``c A A + b A`` rounded once everywhere, then the diagonal
      written again as ``c A A + b A + a`` rounded once (``diagonal_scatter``); every element
      as the expression rounds it (``a I`` adds ``a`` on the diagonal and an exact 0 elsewhere);
    * None (the op's eager implementation): in place, ``c A A`` and ``b A`` each rounded
      to ``acc``, summed, ``a`` added to the diagonal, the same roundings, in four passes over ``B`` where the
      expression's eight operations each allocate their result (2026-12-07, this 2-core CPU,
      2048x2048 bf16: 22.4 ms against 69.6, every element the same). ``work``: two buffers in
      ``acc`` and one in ``dtype`` of ``A``'s shape to write into (:func:`polynomial_in_buffers`)."""
    a, b, c = coefficients
    if isinstance(eye, Tensor):
        return (c * AA.to(acc) + b * A.to(acc) + a * eye).to(dtype)
    if eye == DIAGONAL:
        diagonal = (c * AA.diagonal(dim1=-2, dim2=-1).to(acc) + b * A.diagonal(dim1=-2, dim2=-1).to(acc) + a).to(dtype)
        return (c * AA.to(acc) + b * A.to(acc)).to(dtype).diagonal_scatter(diagonal, dim1=-2, dim2=-1)
    total, scaled, out = work if work is not None else (None, None, None)
    B = _scaled(AA, c, acc, total)
    B.add_(_scaled(A, b, acc, scaled))
    B.diagonal(dim1=-2, dim2=-1).add_(a)
    return B.to(dtype) if out is None or dtype == acc else out.copy_(B)


# polynomial's traced form on the CPU: a I added on the diagonal alone
DIAGONAL = "diagonal"


def traced_identity(n: int, device: torch.device, acc: torch.dtype) -> Tensor | str:
    """How the traced polynomial form adds ``a I`` on ``device`` (:func:`polynomial`'s ``eye``):
    on the CPU :data:`DIAGONAL`, since Inductor's C++ kernel of the identity compares an int64
    index vector per element (one kernel of ``[6, 384, 384]`` bf16: 0.37-0.42 ms with the
    identity against 0.15 ms on the diagonal, equal to the bit; 2026-12-07, this 2-core Intel
    Xeon VM, torch 2.13); elsewhere the ``n x n`` identity in ``acc``, which a GPU kernel
    compares in registers (the diagonal form is not measured there)."""
    return DIAGONAL if device.type == "cpu" else identity(n, device, acc)


def _scaled(t: Tensor, s: float, acc: torch.dtype, out: Tensor | None) -> Tensor:
    """``s * t.to(acc)``, into ``out`` if given, in one pass where ``t`` is in ``acc`` already."""
    if out is None:
        return t * s if t.dtype == acc else t.to(acc).mul_(s)
    return torch.mul(t, s, out=out) if t.dtype == acc else out.copy_(t).mul_(s)


def identity(n: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """The ``n x n`` identity, built by comparing an int64 index (``torch.eye``'s uint16
    index stops Inductor's vectorisation)."""
    index = torch.arange(n, device=device)
    return (index[:, None] == index[None, :]).to(dtype)


def _symmetric(products: str):  # noqa: ANN202
    """The product of two operands whose result is symmetric: ``torch.bmm`` as :func:`_formed`, or, for
    ``products="sym"``, :func:`muon_compile.kernels.sym.sym_bmm`."""
    return sym_bmm if products == SYMMETRIC else _formed(torch.bmm, products)


def gram_iteration(X: Tensor, args: NSArgs, acc: torch.dtype, frobenius: Tensor, products: str = BMM) -> Tensor:
    """The iteration of ``args`` on a batch ``X`` of wide normalised matrices (in ``acc``,
    at least fp32), whose Frobenius norms are ``frobenius`` (``[batch, 1, 1]``), evaluated
    on their Gram matrices.

    Every iterate is ``X_t = Q_t X`` with ``Q_t`` a polynomial in ``R = X X^T``, and
    ``X_t X_t^T = Z R Z`` when ``X_{t+1} = Z X_t``, so::

        R = X X^T
        for each (a, b, c):  Z = c R R + b R + a I;  Q = Z Q (Q = Z the first time);
                             R = Z (Z R)             (not before a restart or the end)
                             restart before each of args.restarts (default: every
                             RESTART_EVERY iterations): X = Q X; R = X X^T
        result = Q X

    ``X`` is multiplied twice per run between restarts, the rest is ``rows x rows``. The
    Gram matrix squares ``X``'s condition number, so a bf16 step iterates in fp16
    (:func:`muon_compile.ns.cost.iteration_dtype`: 3 more bits, the same matmul rate on
    GPUs); like the textbook iteration, ``Z`` is summed in ``acc`` and rounded once.
    fp16's range is narrow, so the iteration runs on ``X / f`` (``f`` its Frobenius norm,
    1 but for inputs near zero): ``R`` is then ``R / f^2``, ``Z = c f^4 R R + b f^2 R + a I``
    is unchanged, and the result is multiplied by ``f`` in ``acc``. And every ``R`` but
    the first is kept near a unit trace (:func:`unit_trace`, with the scale ``r`` it is taken
    in, ``Z = c r^2 R R + b r R + a I``), and ``X`` near a unit norm at each restart (``Q``
    carries the scale): the singular values of an input near zero (its norm below the
    normalisation's ``eps``) grow by ``a`` each iteration, so its ``R`` by ``a^2``, and
    ``R R`` left fp16's range (Keller's coefficients: ``inf`` at the fifth iteration, then
    NaN, for a 64x256 input of norm 1e-10; at 10 iterations ``X`` too). The scales are
    powers of two, so an input whose ``R`` stays in range gets the same bits as without them.
    ``f`` comes from :func:`frobenius_norm`, right also where fp32 loses the squares.

    With symmetric products (``products="sym"``) only an exactly symmetric ``R`` is squared
    by the kernel, one of ``X X^T``: ``R = Z (Z R)`` is symmetric to its rounding only, and
    the kernel's mirror of its square's upper triangle strayed from ``bmm``'s (Polar Express,
    5 iterations: 1.7x ``bmm``'s error against the exact iteration; 10 of the quintic: 18x).

    The cast of ``X / f`` to the iteration dtype is a plain one, fused with the normalisation
    (an opaque op and one more pass over ``X`` until torch 2.13's C++ code generation failed
    on it no more: :func:`muon_compile.compile.compat.tolerate_unread_users`).
    """
    dtype = iteration_dtype(GRAM, args.compute_dtype)
    f = frobenius.clamp_min(torch.finfo(acc).tiny)
    X = (X / f).to(dtype)
    eye = identity(X.size(-2), X.device, acc)
    symmetric, bmm = _symmetric(products), _formed(torch.bmm, products)
    Q = None
    i = 0
    for length in segments(args.steps, args.restarts):
        first = None  # the segment's first Z: Q = Z / (X's scale) carries X's scale
        if Q is None:  # X / f has a unit norm: R a unit trace
            R = symmetric(X, X.mT)
        else:
            X = bmm(Q, X)
            R, first = unit_norm(symmetric(X, X.mT), f, acc)
            f = f * first
        r = f * f
        for j in range(length):
            a, b, c = args.coefficients[i]
            square = symmetric if j == 0 else bmm  # R exactly symmetric: see above
            Z = (c * (r * r) * square(R, R).to(acc) + b * r * R.to(acc) + a * eye).to(dtype)
            if j == 0:
                Q = Z if first is None else (Z / first).to(dtype)
            else:
                Q = bmm(Z, Q)
            if j + 1 < length:
                R, r = unit_trace(bmm(Z, bmm(Z, R)), r, acc)
            i += 1
    return (bmm(Q, X).to(acc) * f).to(args.compute_dtype)


def _power_below(x: Tensor) -> Tensor:
    """The power of two at or below each ``x``; 1 where ``x`` is 0."""
    return torch.where(x > 0, torch.exp2(torch.floor(torch.log2(x))), 1.0)


def _down_scale(size: Tensor, unit: Tensor) -> Tensor:
    """The power of two at or below ``size``, but at least 1 and at most the one at or
    below ``1 / unit``: a matrix taken in units of ``unit`` (< 1 only for an input near
    zero) is scaled down only while its unit stays below 1, so an input whose unit is 1
    keeps its bits."""
    return torch.clamp(torch.minimum(_power_below(size), _power_below(1 / unit)), min=1.0)


def _trace(R: Tensor, acc: torch.dtype) -> Tensor:
    return torch.diagonal(R, dim1=-2, dim2=-1).to(acc).sum(-1)[:, None, None]


def unit_trace(R: Tensor, scale: Tensor, acc: torch.dtype) -> tuple[Tensor, Tensor]:
    """``R``, a batch of Gram matrices taken in units of ``scale`` (``[batch, 1, 1]``),
    divided exactly by the power of two at or below its trace (:func:`_down_scale`), and
    ``scale`` times that power (:func:`gram_iteration`)."""
    power = _down_scale(_trace(R, acc), scale)
    return (R / power).to(R.dtype), scale * power


def unit_norm(R: Tensor, unit: Tensor, acc: torch.dtype) -> tuple[Tensor, Tensor]:
    """For ``R = X X^T`` of a batch ``X`` taken in units of ``unit``: the power of two ``s``
    at or below ``X``'s norm (the square root of the trace; :func:`_down_scale`) and
    ``R / s^2`` exactly, the Gram matrix of ``X / s``, which the caller takes in units ``s``
    times larger (:func:`gram_iteration`)."""
    s = _down_scale(_trace(R, acc).sqrt(), unit)
    return (R / (s * s)).to(R.dtype), s

"""The Newton–Schulz math, pure and tiny: the op's eager implementation and the
function the ``lower`` pass traces into the graph, so both compute the same thing."""

from __future__ import annotations

import torch
from torch import Tensor

from .ns_args import NSArgs
from .rounding_cast import to_low_precision


def orthogonalize(x: Tensor, args: NSArgs) -> Tensor:
    """Approximate the orthogonal polar factor of each matrix in ``x`` (2-D, or 3-D batched).

    1. A tall matrix (rows > cols) is transposed so the Gram matrix is the small one.
    2. ``X = x.to(compute_dtype)`` (the reference code's first step; casting commutes
       with stacking, transposing and zero-padding, so a batch of compute-dtype copies
       gives exactly the per-matrix result; :func:`to_low_precision` keeps this rounding
       where a torch version's fusion would drop it), then ``X0 = X / (||X||_F * norm_scale + eps)``
       (or ``/ max(||X||_F * norm_scale, eps)`` when ``clamp_eps``), evaluated in at
       least fp32 and rounded once to ``compute_dtype``.
    3. For each iteration's ``(a, b, c)``: ``A = X X^T; B = c A A + b A + a I; X = B X``: three plain bmm
       and one small (rows x rows) pointwise step, summed in at least fp32 and rounded
       once. Folding ``a X`` into ``B``'s diagonal keeps the big product a plain bmm: on
       CPU ``baddbmm`` first copies its input into the output and adds an epilogue pass,
       15% of a gpt-small step. In low precision the diagonal ``a + B_ii`` rounds
       relative to its own size, the size of the output it scales, so the rounding error
       matches ``a X + B X`` rounded once.
    4. Transpose back; the result has ``x``'s shape, dtype and a contiguous layout.
    """
    batch = x if x.dim() == 3 else x.unsqueeze(0)
    tall = batch.size(-2) > batch.size(-1)
    if tall:
        batch = batch.mT
    compute_dtype = args.compute_dtype
    acc = torch.promote_types(compute_dtype, torch.float32)
    X = to_low_precision(batch, compute_dtype).to(acc)
    norm = torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True)
    if args.norm_scale != 1.0:
        norm = norm * args.norm_scale
    denom = norm.clamp_min(args.eps) if args.clamp_eps else norm + args.eps
    X = (X / denom).to(compute_dtype)
    index = torch.arange(X.size(-2), device=X.device)  # int64: torch.eye's uint16 index stops vectorisation
    eye = (index[:, None] == index[None, :]).to(acc)
    for a, b, c in args.coefficients:
        A = torch.bmm(X, X.mT)
        B = (c * torch.bmm(A, A).to(acc) + b * A.to(acc) + a * eye).to(compute_dtype)
        X = torch.bmm(B, X)
    if tall:
        X = X.mT
    if x.dim() == 2:
        X = X.squeeze(0)
    return X.to(x.dtype).contiguous()


def ns_flops(rows: int, cols: int, steps: int) -> int:
    """Matmul FLOPs of ``steps`` iterations on one rows x cols matrix: ``T (4 m^2 n + 2 m^3)``, m <= n."""
    m, n = min(rows, cols), max(rows, cols)
    return steps * (4 * m * m * n + 2 * m * m * m)

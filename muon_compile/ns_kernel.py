"""The Newton–Schulz math, pure and tiny: the op's eager implementation and the
function the ``lower`` pass traces into the graph, so both compute the same thing."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .coefficients import Triple, schedule


def orthogonalize(
    x: Tensor,
    coefficients: Sequence[Triple],
    steps: int,
    eps: float,
    norm_scale: float,
    clamp_eps: bool,
    compute_dtype: torch.dtype,
) -> Tensor:
    """Approximate the orthogonal polar factor of each matrix in ``x`` (2-D, or 3-D batched).

    1. A tall matrix (rows > cols) is transposed so the Gram matrix is the small one.
    2. ``X0 = x / (||x||_F * norm_scale + eps)`` (or ``/ max(||x||_F * norm_scale, eps)``
       when ``clamp_eps``), computed in at least fp32, then cast to ``compute_dtype``.
    3. ``steps`` times: ``A = X X^T; B = b A + c A A; X = a X + B X`` as bmm / baddbmm.
    4. Transpose back; the result has ``x``'s shape, dtype and a contiguous layout.
    """
    batch = x if x.dim() == 3 else x.unsqueeze(0)
    tall = batch.size(-2) > batch.size(-1)
    if tall:
        batch = batch.mT
    wide = batch.to(torch.promote_types(x.dtype, torch.float32))
    norm = torch.linalg.vector_norm(wide, dim=(-2, -1), keepdim=True)
    if norm_scale != 1.0:
        norm = norm * norm_scale
    denom = norm.clamp_min(eps) if clamp_eps else norm + eps
    X = (wide / denom).to(compute_dtype)
    for a, b, c in schedule(coefficients, steps):
        A = torch.bmm(X, X.mT)
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)
        X = torch.baddbmm(X, B, X, beta=a)
    if tall:
        X = X.mT
    if x.dim() == 2:
        X = X.squeeze(0)
    return X.to(x.dtype).contiguous()


def ns_flops(rows: int, cols: int, steps: int) -> int:
    """Matmul FLOPs of ``steps`` iterations on one rows x cols matrix: ``T (4 m^2 n + 2 m^3)``, m <= n."""
    m, n = min(rows, cols), max(rows, cols)
    return steps * (4 * m * m * n + 2 * m * m * m)

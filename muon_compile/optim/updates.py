"""Per-parameter update rules of Muon and AdamW, written as plain tensor code.

Hyper-parameters arrive as 0-D float64 tensors so a compiled step reads them as graph
inputs and never recompiles when they change. They are used as they are, never cast to
a low-precision parameter dtype (0.95 would become 0.9492 in bf16); a 0-D tensor does not
change the dtype of the tensor it multiplies.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from ..modes import Mode
from ..ns.args import NSArgs
from ..ns.op import newton_schulz_any


class AdjustLR(Mode):
    """The shape-dependent learning-rate multiplier of a Muon update (:func:`lr_ratio`)."""

    ORIGINAL = "original"
    MATCH_RMS_ADAMW = "match_rms_adamw"
    SPECTRAL = "spectral"
    NONE = "none"


def lr_ratio(rows: int, cols: int, mode: str) -> float:
    """Shape-dependent learning-rate multiplier of a rows x cols update.

    ``original``: sqrt(max(1, rows/cols)) (Keller Jordan); ``match_rms_adamw``:
    0.2 * sqrt(max(rows, cols)) (Moonshot); ``spectral``: sqrt(max(rows, cols))
    (Megatron's ``scale_mode="spectral"``); ``none``: 1.
    """
    if mode == "original":
        return math.sqrt(max(1.0, rows / cols))
    if mode == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    if mode == "spectral":
        return math.sqrt(max(rows, cols))
    if mode == "none":
        return 1.0
    AdjustLR.check(mode, "adjust_lr")
    raise AssertionError(f"adjust_lr {mode!r} has no ratio")  # a mode added without its rule


def second_moment_shape(shape: torch.Size) -> tuple[int, ...]:
    """NorMuon's factored second moment of a ``(..., rows, cols)`` update: one value per
    row (``(..., rows, 1)``) when rows >= cols, else one per column (``(..., 1, cols)``)."""
    rows, cols = shape[-2], shape[-1]
    return (*shape[:-2], rows, 1) if rows >= cols else (*shape[:-2], 1, cols)


def variance_normalize(update: Tensor, second_moment: Tensor, beta2: Tensor) -> Tensor:
    """NorMuon-style variance reduction (nanochat): each row (or column, by the shape of
    ``second_moment``) of the orthogonalised ``update`` is divided by the root of its
    running mean square, then the whole is rescaled to ``update``'s Frobenius norm.
    ``second_moment`` is updated in place (an EMA with ``beta2``)."""
    reduce_dim = -1 if second_moment.shape[-1] == 1 else -2
    u = update.to(second_moment.dtype)  # at least fp32
    second_moment.lerp_(u.square().mean(dim=reduce_dim, keepdim=True).to(second_moment.dtype), 1 - beta2)
    scaled = u * second_moment.clamp_min(1e-10).rsqrt()
    norms = (u.norm(dim=(-2, -1), keepdim=True), scaled.norm(dim=(-2, -1), keepdim=True))
    return (scaled * (norms[0] / norms[1].clamp_min(1e-10))).to(update.dtype)


def split_orthogonalize(update: Tensor, split: tuple[int, ...], ns_args: NSArgs, adjust_lr: str, tp_mode: str | None = None) -> Tensor:
    """Newton–Schulz of each row block of ``update`` on its own (Megatron's ``split_qkv``;
    equal blocks = per-head), each block scaled by its own ``adjust_lr`` ratio.

    Equal blocks become one batched call on ``(..., blocks, rows, cols)`` reshaped to a
    3-D batch; unequal ones (Q, K, V of grouped-query attention) one call each. Under the
    backend either joins the buckets of its shape like any other matrix.
    """
    cols = update.shape[-1]
    if len(set(split)) == 1:
        rows = split[0]
        blocks = update.reshape(-1, rows, cols)
        out = newton_schulz_any(blocks, ns_args, tp_mode) * lr_ratio(rows, cols, adjust_lr)
        return out.reshape(update.shape)
    parts = update.split(list(split), dim=-2)
    return torch.cat([newton_schulz_any(b, ns_args, tp_mode) * lr_ratio(b.shape[-2], cols, adjust_lr) for b in parts], dim=-2)


def muon_direction(
    grad: Tensor,
    momentum_buffer: Tensor,
    *,
    beta: Tensor,
    nesterov: bool,
    ns_args: NSArgs,
    split: tuple[int, ...] | None = None,
    adjust_lr: str = "original",
    second_moment: Tensor | None = None,
    beta2: Tensor | None = None,
    tp_mode: str | None = None,
) -> Tensor:
    """The orthogonalised Muon direction of ``grad``: momentum (``momentum_buffer`` is
    updated in place), Newton–Schulz (of each row block with ``split``), and NorMuon's
    variance reduction when ``second_moment`` is given (updated in place)."""
    fresh = grad * (1 - beta)
    momentum_buffer.mul_(beta).add_(fresh)
    update = fresh + momentum_buffer * beta if nesterov else momentum_buffer
    if split is None:
        ortho = newton_schulz_any(update, ns_args, tp_mode)
    else:
        ortho = split_orthogonalize(update, split, ns_args, adjust_lr, tp_mode)
    if second_moment is not None:
        ortho = variance_normalize(ortho, second_moment, beta2)
    return ortho


def apply_update(param: Tensor, ortho: Tensor, *, decay: Tensor, lr: Tensor, lr_scale: float, cautious: bool = False) -> None:
    """Decoupled weight decay (cautious: only where ``ortho`` and ``param`` agree in sign),
    then ``param -= lr * lr_scale * ortho``, in place."""
    if isinstance(ortho, DTensor) and ortho.placements != param.placements:
        # A layout left to DTensor (or a NorMuon scale that DTensor replicated) gives the
        # whole matrix; keep this rank's shard, a local slice (DTensor refuses the
        # placement change inside an in-place op).
        ortho = ortho.redistribute(param.device_mesh, param.placements)
    if cautious:
        param.mul_(1 - (1 - decay) * (ortho * param >= 0))
    else:
        param.mul_(decay)
    param.add_(scaled_step(ortho, lr, lr_scale))


def scaled_step(ortho: Tensor, lr: Tensor, lr_scale: float) -> Tensor:
    """What a Muon step adds to the (decayed) parameter: ``-lr * lr_scale * ortho``."""
    return ortho * step_factor(lr, lr_scale)


def step_factor(lr: Tensor, lr_scale: float) -> Tensor:
    """The factor of the orthogonalised direction in a Muon step, ``-lr * lr_scale`` (0-D)."""
    return lr * -lr_scale


def gate(value: Tensor, live: Tensor, idle: float) -> Tensor:
    """``value`` where the 0-D flag ``live`` is 1, ``idle`` where it is 0 (a skipped step)."""
    return torch.where(live > 0, value, torch.full_like(value, idle))


def adamw_update(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: Tensor,
    *,
    lr: Tensor,
    beta1: Tensor,
    beta2: Tensor,
    eps: Tensor,
    weight_decay: Tensor,
    live: Tensor | None = None,
) -> None:
    """One AdamW step (decoupled weight decay, bias correction) on ``param``.

    ``live`` (a 0-D 1 or 0, see ``MuonAdamW(skip_nonfinite=True)``): 0 leaves the
    parameter, the moments and ``step`` as they are, with a finite ``grad``. The moments'
    decay is gated, not the betas: bias correction needs the true ones.
    """
    ema1, ema2 = beta1, beta2
    if live is not None:
        lr, ema1, ema2 = lr * live, gate(beta1, live, 1.0), gate(beta2, live, 1.0)
    step.add_(1 if live is None else live)
    count = step if live is None else step.clamp_min(1)  # skipped since step 0: no bias to correct yet
    param.mul_(1 - lr * weight_decay)
    exp_avg.mul_(ema1).add_(grad * (1 - ema1))
    exp_avg_sq.mul_(ema2).add_(grad * grad * (1 - ema2))
    bias1 = 1 - beta1**count
    bias2 = 1 - beta2**count
    denom = (exp_avg_sq / bias2).sqrt() + eps
    param.sub_(exp_avg / denom * (lr / bias1))

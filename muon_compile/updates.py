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

from .routing import newton_schulz_any

ADJUST_LR_MODES = ("original", "match_rms_adamw", "spectral", "none")


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
    raise ValueError(f"unknown adjust_lr mode {mode!r}; known: {ADJUST_LR_MODES}")


def muon_update(
    param: Tensor,
    grad: Tensor,
    momentum_buffer: Tensor,
    *,
    beta: Tensor,
    decay: Tensor,
    lr: Tensor,
    nesterov: bool,
    ns_args: tuple,
    lr_scale: float,
) -> None:
    """One Muon step on ``param``: momentum, Newton–Schulz, decoupled weight decay, update.

    ``beta`` is the momentum, ``decay`` the weight-decay factor ``1 - lr * wd`` (both 0-D
    tensors computed once per group); ``ns_args`` are the op's arguments after ``x``.
    """
    fresh = grad * (1 - beta)
    momentum_buffer.mul_(beta).add_(fresh)
    update = fresh + momentum_buffer * beta if nesterov else momentum_buffer
    ortho = newton_schulz_any(update, *ns_args)
    if isinstance(ortho, DTensor) and ortho.placements != param.placements:
        # A layout left to DTensor returns the whole (replicated) matrix; keep this rank's
        # shard, a local slice (DTensor refuses it inside add_ when a shard is empty).
        ortho = ortho.redistribute(param.device_mesh, param.placements)
    param.mul_(decay)
    param.add_(ortho * (lr * -lr_scale))


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
) -> None:
    """One AdamW step (decoupled weight decay, bias correction) on ``param``."""
    step.add_(1)
    param.mul_(1 - lr * weight_decay)
    exp_avg.mul_(beta1).add_(grad * (1 - beta1))
    exp_avg_sq.mul_(beta2).add_(grad * grad * (1 - beta2))
    bias1 = 1 - beta1**step
    bias2 = 1 - beta2**step
    denom = (exp_avg_sq / bias2).sqrt() + eps
    param.sub_(exp_avg / denom * (lr / bias1))

"""What the two Newton–Schulz ops (:mod:`muon_compile.ns.op` and
:mod:`muon_compile.distributed.sharded_op`) share: the check of their input and the registration that
makes backpropagating through them an error."""

from __future__ import annotations

import torch
from torch import Tensor


def check_input(x: Tensor) -> None:
    """Raise ``ValueError`` for an input the op does not define a result for."""
    if x.dim() not in (2, 3):
        raise ValueError(f"newton_schulz expects a 2-D matrix or a 3-D batch, got shape {tuple(x.shape)}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"newton_schulz expects a real floating-point tensor, got {x.dtype}")


def register_no_derivative(qualname: str) -> None:
    """Make backpropagating through op ``qualname`` an error (it has no derivative)
    instead of autograd's silent fallback."""

    def backward(ctx: object, grad: Tensor) -> None:
        raise RuntimeError(f"{qualname} has no derivative: Newton–Schulz is applied to optimizer updates, not backpropagated")

    torch.library.register_autograd(qualname, backward, setup_context=lambda ctx, inputs, output: None)

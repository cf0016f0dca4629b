"""``muon_compile::newton_schulz``: the op that the optimizers emit and the passes rewrite.

Schema::

    newton_schulz(Tensor x, float[] coefficients, int steps, float eps,
                  float norm_scale, bool clamp_eps, ScalarType compute_dtype) -> Tensor

``coefficients`` is the flat ``[a0, b0, c0, a1, b1, c1, ...]`` schedule (the last triple
repeats); ``x`` is one matrix (2-D) or a batch of matrices (3-D, each orthogonalised
on its own). The result has ``x``'s shape and dtype. The op is functional, has a fake
implementation for tracing, and a DTensor sharding rule that asks for a replicated
input (a batch may also stay sharded on its batch dimension).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import coefficients as coeffs
from .ns_kernel import orthogonalize

_COMPUTE_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def check_args(x: Tensor, coefficients: list[float], steps: int, eps: float, compute_dtype: torch.dtype) -> None:
    """Raise ``ValueError`` for an input the op does not define a result for."""
    if x.dim() not in (2, 3):
        raise ValueError(f"newton_schulz expects a 2-D matrix or a 3-D batch, got shape {tuple(x.shape)}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"newton_schulz expects a real floating-point tensor, got {x.dtype}")
    coeffs.unflatten(coefficients)
    if steps < 1:
        raise ValueError(f"newton_schulz steps must be >= 1, got {steps}")
    if not eps >= 0:
        raise ValueError(f"newton_schulz eps must be >= 0, got {eps}")
    if compute_dtype not in _COMPUTE_DTYPES:
        raise ValueError(f"newton_schulz compute_dtype must be one of {_COMPUTE_DTYPES}, got {compute_dtype}")


@torch.library.custom_op("muon_compile::newton_schulz", mutates_args=())
def newton_schulz_op(
    x: Tensor,
    coefficients: list[float],
    steps: int,
    eps: float,
    norm_scale: float,
    clamp_eps: bool,
    compute_dtype: torch.dtype,
) -> Tensor:
    check_args(x, coefficients, steps, eps, compute_dtype)
    return orthogonalize(
        x, coeffs.unflatten(coefficients), steps, eps, norm_scale, clamp_eps, compute_dtype
    )


@newton_schulz_op.register_fake
def _newton_schulz_fake(x, coefficients, steps, eps, norm_scale, clamp_eps, compute_dtype):
    check_args(x, coefficients, steps, eps, compute_dtype)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


NEWTON_SCHULZ = torch.ops.muon_compile.newton_schulz.default


def _register_sharding() -> None:
    """Replicate in, replicate out; a 3-D batch may instead stay ``Shard(0)`` on its batch dim."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding

    @register_sharding(NEWTON_SCHULZ)
    def _ns_sharding(x, coefficients, steps, eps, norm_scale, clamp_eps, compute_dtype):
        no_args = [None] * 6
        strategies = [([Replicate()], [Replicate(), *no_args])]
        if len(x.shape) == 3:
            strategies.append(([Shard(0)], [Shard(0), *no_args]))
        return strategies


if torch.distributed.is_available():
    _register_sharding()


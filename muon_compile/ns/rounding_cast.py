"""``to_low_precision(x, dtype)``: ``x.to(dtype)`` whose rounding survives Inductor's fusion.

Where :data:`muon_compile.compile.compat.CPU_FUSION_DROPS_ROUND_TRIP` holds (a torch version whose
C++ code generation drops an fp32 -> bf16 -> fp32 round trip inside one fused kernel),
the cast of a CPU tensor goes through ``muon_compile::rounding_cast``, an opaque op that
Inductor runs as a separate kernel, so its low-precision result is stored and reloaded as
eager execution would. Everywhere else it is a plain ``x.to(dtype)`` and leaves no trace
in the graph.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..compile.compat import CPU_FUSION_DROPS_ROUND_TRIP

_QUALNAME = "muon_compile::rounding_cast"

torch.library.define(_QUALNAME, "(Tensor x, ScalarType dtype) -> Tensor")


@torch.library.impl(_QUALNAME, "CompositeExplicitAutograd")
def _rounding_cast_impl(x: Tensor, dtype: torch.dtype) -> Tensor:
    return x.to(dtype)


@torch.library.register_fake(_QUALNAME)
def _rounding_cast_fake(x: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.empty_like(x, dtype=dtype)


def opaque_cast(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x.to(dtype)`` as the opaque op on every torch version: a kernel of its own that
    Inductor does not fuse with the producer of ``x``."""
    return torch.ops.muon_compile.rounding_cast.default(x, dtype)


def to_low_precision(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x.to(dtype)``; through the opaque op only where fusion would lose its rounding."""
    if CPU_FUSION_DROPS_ROUND_TRIP and x.device.type == "cpu" and dtype.itemsize < x.dtype.itemsize:
        return opaque_cast(x, dtype)
    return x.to(dtype)

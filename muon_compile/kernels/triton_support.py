"""Where this package's own Triton kernels run: Triton's import, its interpreter, the devices.

Triton comes with torch's CUDA builds; the CPU build runs without it (``triton`` is None
then). With ``TRITON_INTERPRET=1`` in the environment before Triton is imported, Triton runs
kernels on the CPU through its interpreter: how the tests check the kernels without a GPU.
"""

from __future__ import annotations

import contextlib
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where Triton is absent
    triton = None
    tl = None


def interpreted() -> bool:
    """Whether Triton runs kernels through its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_usable(device: torch.device) -> bool:
    """Whether a kernel of this package runs on ``device``: CUDA with Triton, and the CPU
    under Triton's interpreter only (how the tests run the kernels here)."""
    return triton is not None and (device.type == "cuda" or (device.type == "cpu" and interpreted()))


def on(device: torch.device) -> contextlib.AbstractContextManager:
    """``device`` made current for a launch (Triton launches on the current CUDA device)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


if triton is not None:

    @triton.jit
    def bf16_rounded(x):
        """fp32 ``x`` rounded to bf16 to nearest, ties to even, as fp32 (its bits' upper half).

        Triton's interpreter converts fp32 to bf16 toward zero, where a GPU rounds to nearest
        even: a kernel run by the interpreter rounds through this first, so the conversion
        that follows is exact and the result is the GPU's."""
        bits = x.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return bits.to(tl.float32, bitcast=True)

else:  # pragma: no cover - exercised where Triton is absent
    bf16_rounded = None

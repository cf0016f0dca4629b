"""CPU offload of optimizer state between steps.

With ``offload_state=True`` every state tensor of more than zero dimensions (momentum,
NorMuon's second moment, AdamW's moments) lives in host memory (pinned when CUDA is
available) between steps. A step copies each parameter's state, or each stack's
(:mod:`muon_compile.optim.stacks`), to the parameters' device (:func:`stage`), updates the
copies, and writes them back (:func:`write_back`).
A DTensor's state stays a DTensor with the parameter's mesh and placements; only its
local shard moves. 0-D state (AdamW's step count) stays where it is.

On CUDA both copies are non-blocking (the host side is pinned), so they overlap with the
step's kernels; the host state is complete once the stream reaches the end of the step:
the next step's copies in are ordered after it on the stream, and the optimizers'
``state_dict()`` waits for it before handing the tensors out.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from ..distributed.routing import wrap_like


def _local(t: Tensor) -> Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def to_host(t: Tensor) -> Tensor:
    """``t``, moved to host memory (pinned when CUDA is available); a DTensor keeps its layout."""
    local = _local(t).to("cpu", copy=True)
    if torch.cuda.is_available():
        local = local.pin_memory()
    return wrap_like(local, t)


def stage(host: Tensor, device: torch.device) -> Tensor:
    """A copy of the host state ``host`` on ``device`` (always a copy, also when the device is the host)."""
    return wrap_like(_local(host).to(device, non_blocking=True, copy=True), host)


def write_back(host: Tensor, staged: Tensor) -> None:
    """Copy the updated ``staged`` state into ``host``."""
    _local(host).copy_(_local(staged), non_blocking=True)

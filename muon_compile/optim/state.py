"""The optimizer state of :class:`~muon_compile.MuonAdamW`, from construction to checkpoint.

State is made when a group is added (:meth:`StateStore.create`), so every rank holds the
same keys from step 0; Muon groups keep it stacked (:mod:`muon_compile.optim.stacks`) and,
with ``offload_state``, in host memory between steps (:mod:`muon_compile.optim.offload`): a
step updates the copy :meth:`StateStore.staged` makes and :meth:`StateStore.write_back` puts
it back. Before a checkpoint is loaded, :func:`check_loadable` compares it with the state
held; on CUDA the state is marked as static addresses (:func:`mark_static`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor import zeros as dtensor_zeros

from . import offload
from . import stacks as stacks_mod
from .groups import param_name
from .updates import second_moment_shape


def _zeros_like_factored(p: Tensor) -> Tensor:
    """A zero NorMuon second moment for ``p`` (see :func:`second_moment_shape`); for a DTensor,
    sharded like ``p`` except along the dimension it averages over (replicated there)."""
    shape = second_moment_shape(p.shape)
    dtype = torch.promote_types(p.dtype, torch.float32)  # at least fp32, also for bf16 params
    if not isinstance(p, DTensor):
        return torch.zeros(shape, dtype=dtype, device=p.device)
    reduced = p.dim() - 1 if shape[-1] == 1 else p.dim() - 2  # the dimension the moment averages over
    placements = [Replicate() if isinstance(pl, Shard) and pl.dim % p.dim() == reduced else pl for pl in p.placements]
    return dtensor_zeros(shape, dtype=dtype, device_mesh=p.device_mesh, placements=placements)


def _zeros(p: Tensor) -> Tensor:
    return torch.zeros_like(p, memory_format=torch.preserve_format)


@dataclasses.dataclass(frozen=True)
class StateStore:
    """Where the state lives between steps: on the parameters' device, or in host memory
    (``offload``). Every method takes the optimizer's ``state`` (``load_state_dict`` replaces it)."""

    offload: bool

    def create(self, group: dict, state: dict) -> stacks_mod.GroupStacks:
        """Zero state for each parameter of a new ``group`` (an entry already there is kept),
        and the group's stacked layout (no stacks for AdamW)."""
        for p in group["params"]:
            entry = state[p]
            if group["kind"] == "muon":
                entry.setdefault("momentum_buffer", _zeros(p))
                if group["normuon_beta2"] is not None:
                    entry.setdefault("second_moment", _zeros_like_factored(p))
            else:
                entry.setdefault("step", torch.zeros((), dtype=torch.float32, device=p.device))
                entry.setdefault("exp_avg", _zeros(p))
                entry.setdefault("exp_avg_sq", _zeros(p))
            self._settle(entry)
        if group["kind"] != "muon":
            return stacks_mod.GroupStacks([], tuple(range(len(group["params"]))))
        layout = stacks_mod.group_stacks(group["params"])
        self._restack(group, layout, state)
        return layout

    def reload(self, group: dict, layout: stacks_mod.GroupStacks, state: dict) -> None:
        """After ``load_state_dict``: the loaded state of ``group`` where :meth:`create` keeps it."""
        for p in group["params"]:
            self._settle(state[p])
            if group["kind"] == "adamw":
                state[p]["step"] = state[p]["step"].to(p.device)
        self._restack(group, layout, state)

    def staged(self, entry: dict, device: torch.device) -> dict:
        """The state a step updates: ``entry`` itself, or with ``offload`` its copy on ``device``."""
        if not self.offload:
            return entry
        return {k: offload.stage(v, device) if v.dim() > 0 else v for k, v in entry.items()}

    def write_back(self, entry: dict, staged: dict) -> None:
        """Copy a step's updated ``staged`` state into ``entry`` (nothing to do without offload)."""
        if self.offload:
            for key, value in entry.items():
                if value.dim() > 0:
                    offload.write_back(value, staged[key])

    def _settle(self, entry: dict) -> None:
        """With ``offload``: move a parameter's state (but 0-D entries) to host memory."""
        if self.offload:
            for key, value in entry.items():
                if value.dim() > 0:
                    entry[key] = offload.to_host(value)

    def _restack(self, group: dict, layout: stacks_mod.GroupStacks, state: dict) -> None:
        place = offload.to_host if self.offload else None
        for stack in layout.stacks:
            stacks_mod.restack(stack, group["params"], state, place)


def mark_static(layouts: Sequence[stacks_mod.GroupStacks], state: dict) -> None:
    """Mark the state tensors on CUDA as static addresses, as torch.optim's optimizers
    have Dynamo do: a step replayed as a CUDA graph then updates them where they are
    instead of copying them in and out. Dynamo guards on their identity, so state
    loaded from a checkpoint (new tensors) recompiles the step: a new capture, not a
    stale one."""
    stacked = [t for layout in layouts for stack in layout.stacks for t in stack.state.values()]
    for t in [*stacked, *(t for entry in state.values() for t in entry.values())]:
        if isinstance(t, Tensor) and t.device.type == "cuda":
            torch._dynamo.mark_static_address(t, guard=True)


def _mismatch(saved: Tensor, mine: Tensor) -> str | None:
    """What differs between a saved state tensor and the one this optimizer holds, or None."""
    if tuple(saved.shape) != tuple(mine.shape):
        return f"the state dict holds shape {tuple(saved.shape)}, this optimizer needs {tuple(mine.shape)}"
    if saved.dtype != mine.dtype:
        return f"the state dict holds dtype {saved.dtype}, this optimizer needs {mine.dtype}"
    if isinstance(saved, DTensor) != isinstance(mine, DTensor) or (
        isinstance(mine, DTensor) and tuple(saved.placements) != tuple(mine.placements)
    ):
        placements = [getattr(t, "placements", "a plain tensor") for t in (saved, mine)]
        return f"the state dict holds {placements[0]}, this optimizer needs {placements[1]}"
    return None


def check_loadable(param_groups: Sequence[dict], state: dict, state_dict: dict) -> None:
    """Raise ``ValueError`` at the first saved state tensor that does not fit the one held
    for the same parameter and key (shape, dtype, DTensor placement), naming both; group and
    parameter counts are torch's own check."""
    saved_state = state_dict.get("state", {})
    for group, saved_group in zip(param_groups, state_dict.get("param_groups", ())):
        for i, (p, saved_id) in enumerate(zip(group["params"], saved_group.get("params", ()))):
            for key, saved in saved_state.get(saved_id, {}).items():
                mine = state[p].get(key)
                if isinstance(saved, Tensor) and isinstance(mine, Tensor):
                    problem = _mismatch(saved, mine)
                    if problem:
                        raise ValueError(f"cannot load optimizer state {key!r} of parameter {param_name(group, i)}: {problem}")

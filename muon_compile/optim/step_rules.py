"""How each kind of param group steps: Muon stack by stack and matrix by matrix, AdamW
parameter by parameter, with the update rules of :mod:`muon_compile.optim.updates`.

Each rule reads a group as :mod:`muon_compile.optim.groups` left it (hyper-parameters as 0-D
tensors) and its state through a :class:`~muon_compile.optim.state.StateStore`. With
``skip_nonfinite`` a step first computes :func:`live` (are all gradients finite, on every
rank?) and steps each group as :func:`gated` by it, reading gradients through
:func:`read_grad`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed._functional_collectives as funcol
from torch import Tensor
from torch.distributed.tensor import DTensor

from ..ns import coefficients as coeffs
from ..ns.args import NSArgs
from . import stacks as stacks_mod
from .groups import check_grad
from .state import StateStore
from .updates import adamw_update, apply_update, gate, lr_ratio, muon_direction


def live(param_groups: Sequence[dict]) -> Tensor:
    """1.0 when every gradient is finite on every rank, else 0.0 (0-D float32, no host sync)."""
    grads = [p.grad for g in param_groups for p in g["params"] if p.grad is not None]
    if not grads:
        return torch.ones((), dtype=torch.float32)
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    norms = torch._foreach_norm(local, 2, dtype=torch.float32)
    flag = torch.stack(norms).sum().isfinite().to(torch.float32)
    meshes = {id(g.device_mesh): g.device_mesh for g in grads if isinstance(g, DTensor)}
    for mesh in meshes.values():
        for dim in range(mesh.ndim):
            if mesh.size(dim) > 1:
                flag = funcol.all_reduce(flag, "min", (mesh, dim))
    return flag


def gated(group: dict, live: Tensor) -> dict:
    """A Muon group's view for a step that ``live`` (0-D, 1 or 0) may skip: learning rate
    times ``live`` (no update, no weight decay), momentum and NorMuon's beta 1 when
    skipped (state kept). An AdamW group is gated inside :func:`adamw_update`."""
    if group["kind"] != "muon":
        return group
    view = {**group, "lr": group["lr"] * live, "momentum": gate(group["momentum"], live, 1.0)}
    if group["normuon_beta2"] is not None:
        view["normuon_beta2"] = gate(group["normuon_beta2"], live, 1.0)
    return view


def read_grad(p: Tensor, sanitize: bool) -> Tensor:
    """``p``'s gradient as a step reads it: with ``sanitize`` (``skip_nonfinite``), NaN and inf
    as 0, so that a skipped step, whose updates are gated off, computes with finite values."""
    if sanitize:
        return torch.nan_to_num(p.grad, nan=0.0, posinf=0.0, neginf=0.0)
    return p.grad


def muon_step(group: dict, layout: stacks_mod.GroupStacks, state: dict, store: StateStore, sanitize: bool) -> None:
    """One Muon step of ``group``: each stack of ``layout`` as one where it steps as one
    (:func:`~muon_compile.optim.stacks.steps_as_one`), every other matrix on its own."""
    ns_args = coeffs.ns_args(
        group["ns_coefficients"],
        group["ns_steps"],
        eps=group["ns_eps"],
        compute_dtype=group["ns_dtype"],
        algorithm=group["ns_algorithm"],
    )
    decay = 1 - group["lr"] * group["weight_decay"]
    params = group["params"]
    for stack in layout.stacks:
        members = [params[i] for i in stack.indices]
        if all(p.grad is not None for p in members) and stacks_mod.steps_as_one(members[0].device, len(members)):
            _muon_stack_step(group, stack, members, ns_args, decay, store, sanitize)
        else:  # each member with a gradient steps on its own, on its views of the state
            for i in stack.indices:
                _muon_param_step(group, i, ns_args, decay, state, store, sanitize)
    for i in layout.loose:
        _muon_param_step(group, i, ns_args, decay, state, store, sanitize)


def _muon_param_step(
    group: dict, index: int, ns_args: NSArgs, decay: Tensor, state: dict, store: StateStore, sanitize: bool
) -> None:
    p = group["params"][index]
    if p.grad is None:
        return
    check_grad(group, index, p.grad)
    staged = store.staged(state[p], p.device)
    split, lr_scale = _split_and_scale(group, p.shape)
    ortho = muon_direction(
        read_grad(p, sanitize),
        staged["momentum_buffer"],
        **_direction_args(group, split, ns_args),
        second_moment=staged.get("second_moment"),
    )
    apply_update(p, ortho, decay=decay, lr=group["lr"], lr_scale=lr_scale, cautious=group["cautious_weight_decay"])
    store.write_back(state[p], staged)


def _muon_stack_step(
    group: dict,
    stack: stacks_mod.ParamStack,
    members: list[Tensor],
    ns_args: NSArgs,
    decay: Tensor,
    store: StateStore,
    sanitize: bool,
) -> None:
    """One step of a stack (:mod:`muon_compile.optim.stacks`): the direction of the stacked
    gradients, then one write into the members."""
    for i, p in zip(stack.indices, members):
        check_grad(group, i, p.grad)
    split, lr_scale = _split_and_scale(group, members[0].shape)
    staged = store.staged(stack.state, members[0].device)
    ortho = muon_direction(
        stacks_mod.stack([read_grad(p, sanitize) for p in members]),
        staged["momentum_buffer"],
        **_direction_args(group, split, ns_args),
        second_moment=staged.get("second_moment"),
    )
    store.write_back(stack.state, staged)
    stacks_mod.write(members, decay, ortho, group["lr"], lr_scale, cautious=group["cautious_weight_decay"])


def _row_blocks(split_rows: int | tuple[int, ...] | list[int] | None, rows: int) -> tuple[int, ...] | None:
    """``split_rows`` as block sizes: ``None`` (whole matrix), ``k`` (blocks of k rows:
    per head) or explicit sizes (Q, K, V)."""
    if split_rows is None:
        return None
    if isinstance(split_rows, int):
        return (split_rows,) * (rows // split_rows)
    return tuple(split_rows)


def _split_and_scale(group: dict, shape: torch.Size) -> tuple[tuple[int, ...] | None, float]:
    """Row blocks of a matrix of ``shape`` and its step's scale (``adjust_lr`` ratio
    unless split, times ``extra_scale_factor``)."""
    split = _row_blocks(group["split_rows"], shape[-2])
    ratio = 1.0 if split else lr_ratio(shape[-2], shape[-1], group["adjust_lr"])
    return split, group["extra_scale_factor"] * ratio


def _direction_args(group: dict, split: tuple[int, ...] | None, ns_args: NSArgs) -> dict:
    """``group``'s arguments of :func:`muon_direction` but the state."""
    return dict(
        beta=group["momentum"],
        nesterov=group["nesterov"],
        ns_args=ns_args,
        split=split,
        adjust_lr=group["adjust_lr"],
        beta2=group["normuon_beta2"],
        tp_mode=group["tp_mode"],
    )


def adamw_step(group: dict, state: dict, store: StateStore, sanitize: bool, live: Tensor | None) -> None:
    """One AdamW step of every parameter of ``group`` that has a gradient."""
    beta1, beta2 = group["betas"]
    for i, p in enumerate(group["params"]):
        if p.grad is None:
            continue
        check_grad(group, i, p.grad)
        staged = store.staged(state[p], p.device)
        adamw_update(
            p,
            read_grad(p, sanitize),
            staged["exp_avg"],
            staged["exp_avg_sq"],
            staged["step"],
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            live=live,
        )
        store.write_back(state[p], staged)

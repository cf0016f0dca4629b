"""The stacked layout of Muon state: parameters of one shape step as one stacked tensor.

Within a Muon param group, plain (non-DTensor) 2-D parameters of equal shape, dtype and
device form a *stack*. Their state (momentum, NorMuon's second moment) lives in one
tensor per stack with a leading dimension, and ``optimizer.state[p]`` holds views into
it, so ``state_dict()`` / ``load_state_dict`` and per-parameter access work as before.
A step of a stack is list-level: :func:`stack` stacks the gradients, the Muon direction
(momentum, one batched Newton–Schulz, NorMuon) is computed on the stacked tensors, and
:func:`write` applies ``p = p * (1 - lr * wd) - lr * s * O`` to every member (cautious
weight decay included).

Compiled, the step then costs what the stacks cost, not what the parameters cost: Dynamo
traces a handful of operations per stack. Where a stack steps as one is chosen per device,
by measurement (:func:`steps_as_one`):

- On a GPU, and eagerly everywhere, a stack steps as one, by two custom ops
  (``muon_compile::stack``, ``muon_compile::unstack_scale_add_``) that Inductor keeps as one
  call each: its own lowering of ``torch.stack`` over hundreds of inputs launches a copy per
  input, and of N parameters' writes N kernels, where the write op is one launch of its
  Triton kernel (:mod:`muon_compile.kernels.scale_add`). Eagerly on the CPU, stacks make the
  step 1.5x to 3x faster than member by member (docs/benchmarks.md).
- In a step compiled for the CPU, every member of a stack of at most
  :data:`MEMBERS_APART` steps on its own, on its views of the stacked state, and the
  ``muon`` backend buckets their Newton–Schulz loops as it does unmodified code's: Inductor's
  C++ code lowers the gather to copies into a fresh float32 buffer, and a CPU batched product
  of a tall stack's transposed view runs at half speed, where the members' bfloat16 inputs are
  stacked by the bucket pass, row-major (llama-1b-2l: 3.85 s a step stacked, 3.53 s member by
  member, unmodified ``torch.optim.Muon`` 3.69 s). A larger stack steps as one.
- Compiled where the write op is not one pass (:func:`writes_in_one_pass`: off CUDA), a stack
  of at most :data:`MEMBERS_APART` is written member by member, each write fused by Inductor
  with what computes it; a larger one by the op (two ``foreach`` passes). Member by member,
  Inductor's cold compile grows by about 0.2 s a member, its C++ code generation by far the
  most of it (2026-12-07, this 2-core CPU, float32 NS, weight decay 0.1: 2,000 matrices of four
  shapes in stacks of 500, 150-170 s written member by member, 33 s by the op, whose step is
  11.9 ms; 200 members of 16x16: 17.6 s and 1.49 ms a step member by member, 6.4 s and
  2.17 ms by the op, the op's two passes dispatched per member; 32 of 256x256: 6.3 s and
  18.50 ms, 4.8 s and 17.16 ms).

Replace state in place (``state[p]["momentum_buffer"].copy_(t)``): a tensor put in
its place is not read by the stacked step (``load_state_dict`` restacks itself).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from ..kernels import scale_add as scale_add_kernel
from .updates import apply_update, step_factor


@torch.library.custom_op("muon_compile::stack", mutates_args=())
def stack(tensors: list[Tensor]) -> Tensor:
    """``torch.stack(tensors)``, one opaque call when compiled."""
    return torch.stack(tensors)


@stack.register_fake
def _stack_fake(tensors: list[Tensor]) -> Tensor:
    first = tensors[0]
    return first.new_empty((len(tensors), *first.shape))


@torch.library.custom_op("muon_compile::unstack_scale_add_", mutates_args=("dsts",))
def unstack_scale_add_(
    dsts: list[Tensor], scale: Tensor, src: Tensor, alpha: Tensor, cautious: bool = False, src_scale: float = 1.0
) -> None:
    """``dsts[i].mul_(scale).add_(src[i], alpha=alpha)`` for every ``i`` (``scale`` and ``alpha``
    0-D tensors, ``src`` of any float dtype: the arithmetic is in the members' own), one opaque
    call when compiled. ``cautious``: cautious weight decay, ``scale`` only where
    ``src[i] * dsts[i] >= 0`` (where the update and the parameter agree in sign), 1 elsewhere:
    :func:`muon_compile.optim.updates.apply_update`'s, whose factor is a float64 tensor by type
    promotion, to an ulp. ``src_scale``: ``src * src_scale`` (in ``src``'s dtype, rounded
    there) is added instead of ``src``, as a step that scales its update in place first writes.

    Where Triton runs, one launch of :mod:`muon_compile.kernels.scale_add` (one pass over the
    members); elsewhere ``torch`` calls, where a host ``scale`` of exactly 1 (no weight decay)
    skips the multiply, a pass over the parameters that would change nothing."""
    if scale_add_kernel.launch(dsts, scale, src, alpha, cautious=cautious, src_scale=src_scale):
        return
    if src_scale != 1.0:
        src = src * src_scale
    if cautious:
        for d, s in zip(dsts, src.unbind(0)):
            d.mul_(torch.where(s * d >= 0, scale.to(d.dtype), 1.0))
    elif scale.device.type != "cpu":
        torch._foreach_mul_(dsts, scale)
    elif scale.item() != 1.0:
        torch._foreach_mul_(dsts, scale.item())
    if alpha.device.type == "cpu":
        torch._foreach_add_(dsts, list(src.unbind(0)), alpha=alpha.item())
    else:  # no value on the host: the product in the members' dtype first
        torch._foreach_add_(dsts, list((src.to(dsts[0].dtype) * alpha).unbind(0)))


# the stacked write's op node target, as the passes find it in a post-grad graph
STACK_WRITE = torch.ops.muon_compile.unstack_scale_add_.default


def writes_in_one_pass(device: torch.device, dst_dtype: torch.dtype, src_dtype: torch.dtype) -> bool:
    """Whether :func:`unstack_scale_add_` runs as one pass over its members (its Triton kernel,
    :func:`muon_compile.kernels.scale_add.takes`): on CUDA. Elsewhere it is two
    ``torch._foreach_*`` passes, where Inductor's code writes each member in one: compiled,
    the op then writes only a stack of more than :data:`MEMBERS_APART` (:func:`write`;
    :mod:`muon_compile.passes.writes.stack_writes` leaves unmodified code's writes as they are)."""
    return scale_add_kernel.takes(device, dst_dtype, src_dtype)


# the most members of a stack that step one by one in a step compiled for the CPU, and that a
# compiled step writes one by one where the write op is not one pass (module docstring)
MEMBERS_APART = 16


def steps_as_one(device: torch.device, members: int) -> bool:
    """Whether a stack of ``members`` on ``device`` steps as one (:func:`stack` of the
    gradients, one direction, :func:`write`) rather than member by member on its views of
    the state: everywhere but in a step compiled for the CPU, and there for a stack of more
    than :data:`MEMBERS_APART` (see the module's docstring)."""
    apart = torch.compiler.is_compiling() and device.type == "cpu" and members <= MEMBERS_APART
    return not apart


def write(members: list[Tensor], decay: Tensor, ortho: Tensor, lr: Tensor, lr_scale: float, *, cautious: bool) -> None:
    """``p = p * decay - lr * lr_scale * O`` into each member ``p`` and its matrix ``O`` of
    ``ortho`` (cautious: :func:`muon_compile.optim.updates.apply_update`'s decay): one
    :func:`unstack_scale_add_`, or in a compiled step where that is not one pass
    (:func:`writes_in_one_pass`) and the stack has at most :data:`MEMBERS_APART` members, a
    write per member that Inductor fuses with what computes it (the module's docstring)."""
    first = members[0]
    apart = len(members) <= MEMBERS_APART and not writes_in_one_pass(first.device, first.dtype, ortho.dtype)
    if torch.compiler.is_compiling() and apart:
        for p, o in zip(members, ortho.unbind(0)):
            apply_update(p, o, decay=decay, lr=lr, lr_scale=lr_scale, cautious=cautious)
    else:
        unstack_scale_add_(members, decay, ortho, step_factor(lr, lr_scale), cautious=cautious)


@dataclasses.dataclass
class ParamStack:
    """Members ``indices`` (positions in the group's ``params``) and the stacked state,
    ``state[key][j]`` being member ``j``'s ``optimizer.state[p][key]``."""

    indices: tuple[int, ...]
    state: dict[str, Tensor] = dataclasses.field(default_factory=dict, repr=False)


@dataclasses.dataclass
class GroupStacks:
    """A param group's layout: its ``stacks`` and the indices of the ``loose`` parameters
    (each steps on its own)."""

    stacks: list[ParamStack]
    loose: tuple[int, ...]


def group_stacks(params: Sequence[Tensor]) -> GroupStacks:
    """Group ``params`` into stacks: plain 2-D tensors of equal shape, dtype and device,
    two or more, in order of first appearance; the rest are loose."""
    by_key: dict[tuple, list[int]] = defaultdict(list)
    for i, p in enumerate(params):
        if p.dim() == 2 and not isinstance(p, DTensor):
            by_key[(tuple(p.shape), p.dtype, p.device)].append(i)
    stacks = [ParamStack(tuple(indices)) for indices in by_key.values() if len(indices) > 1]
    stacked = {i for stack in stacks for i in stack.indices}
    return GroupStacks(stacks, tuple(i for i in range(len(params)) if i not in stacked))


def restack(
    stack: ParamStack, params: Sequence[Tensor], state: dict, place: Callable[[Tensor], Tensor] | None = None
) -> None:
    """Copy the members' per-parameter state into new stacked tensors (each passed through
    ``place`` if given, e.g. to host memory) and point each member's state at its view of
    them; a key missing from a member is left out."""
    members = [params[i] for i in stack.indices]
    keys = set.intersection(*(set(state[p]) for p in members))
    stack.state = {}
    for key in sorted(keys):
        stacked = torch.stack([state[p][key] for p in members])
        if place is not None:
            stacked = place(stacked)
        stack.state[key] = stacked
        for j, p in enumerate(members):
            state[p][key] = stacked[j]

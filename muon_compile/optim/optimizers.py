"""``MuonAdamW`` (param groups of kind ``"muon"`` or ``"adamw"``) and ``Muon`` (all muon).

Both are plain per-parameter optimizers: eager they run one Newton–Schulz per matrix;
``torch.compile(opt.step, backend="muon")`` buckets, lowers and fuses them.

Hyper-parameters (``lr``, ``momentum``, ``weight_decay``, AdamW's ``betas`` and ``eps``)
are stored in the param groups as 0-D float64 tensors, so a compiled step reads them as
inputs: change them with ``group["lr"].fill_(v)`` or any ``torch.optim.lr_scheduler``
(which fills tensor values in place) and nothing recompiles. Optimizer state is created
at construction, so every rank holds the same state keys from step 0; counters (AdamW's
``step``, ``skipped_steps``) live on the parameters' device and state on CUDA is marked as
static addresses, so a step on a GPU can be replayed as a CUDA graph
(:mod:`muon_compile.compile.cuda_graphs`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor import zeros as dtensor_zeros

from .. import config
from ..compile.compile_step import without_compiled_step
from ..diagnostics.counters import counters
from ..distributed.routing import Kind, layout_of, prepare
from ..ns import coefficients as coeffs
from ..ns.args import NSArgs, check_algorithm
from . import offload
from . import qk_clip as qk_clip_mod
from . import stacks as stacks_mod
from .qk_clip import QKClip
from .updates import (
    AdjustLR,
    adamw_update,
    gate,
    lr_ratio,
    muon_direction,
    muon_update,
    second_moment_shape,
)

log = logging.getLogger(__name__)

KINDS = ("muon", "adamw")
_MUON_SCALARS = ("lr", "momentum", "weight_decay")
_ADAMW_SCALARS = ("lr", "eps", "weight_decay")


def _scalar(value: Any, key: str) -> Tensor:
    """A hyper-parameter as a 0-D float64 tensor, as exact as a Python float (a given 0-D
    tensor is kept, not copied). As a 0-D tensor it never changes a parameter's dtype."""
    if isinstance(value, Tensor):
        if value.numel() != 1 or not value.dtype.is_floating_point:
            raise ValueError(f"hyper-parameter {key!r} must be a float or a 1-element float tensor, got {value!r}")
        return value if value.dim() == 0 else value.reshape(())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"hyper-parameter {key!r} must be a number, got {value!r}")
    return torch.tensor(float(value), dtype=torch.float64)


NS_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}


def _ns_dtype(value: Any) -> torch.dtype:
    """``ns_dtype`` as a dtype: a floating ``torch.dtype`` or one of the names of ``NS_DTYPES``."""
    dtype = NS_DTYPES.get(value, value) if isinstance(value, str) else value
    if dtype not in NS_DTYPES.values():
        raise ValueError(f"ns_dtype must be one of {list(NS_DTYPES)} or the matching torch dtype, got {value!r}")
    return dtype


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


def _row_blocks(split_rows: int | tuple[int, ...] | list[int] | None, rows: int) -> tuple[int, ...] | None:
    """``split_rows`` as block sizes: ``None`` (whole matrix), ``k`` (blocks of k rows:
    per head) or explicit sizes (Q, K, V)."""
    if split_rows is None:
        return None
    if isinstance(split_rows, int):
        return (split_rows,) * (rows // split_rows)
    return tuple(split_rows)


def _value(x: Any) -> float:
    return float(x.item()) if isinstance(x, Tensor) else float(x)


def _state_mismatch(saved: Tensor, mine: Tensor) -> str | None:
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


def _param_name(group: dict, index: int) -> str:
    names = group.get("param_names")
    if names is not None:
        return repr(names[index])
    return f"#{index} (shape {tuple(group['params'][index].shape)})"


class MuonAdamW(torch.optim.Optimizer):
    """Muon for hidden matrices and AdamW for everything else, in one optimizer.

    Args:
        params: param groups, each a dict with ``"params"`` and ``"kind"`` (``"muon"`` or
            ``"adamw"``) and optionally any per-group override of the settings below
            (AdamW groups use ``lr``, ``betas``, ``eps``, ``weight_decay``). Parameters may
            be given as ``(name, tensor)`` pairs; errors then name them.
            :func:`muon_compile.muon_param_groups` builds the usual split from a model.
        lr: Muon learning rate.
        momentum: Muon momentum coefficient, in [0, 1).
        nesterov: use the Nesterov form ``lerp(grad, buf, momentum)`` of the momentum.
        weight_decay: decoupled weight decay ``p *= 1 - lr * wd`` (Muon groups).
        ns_coefficients: a preset name (``"keller"``, ``"polar_express"``, and Megatron's
            ``"simple"``, ``"quintic"``, ``"aol"``; see :mod:`muon_compile.ns.coefficients`),
            an ``(a, b, c)`` triple or a list of per-iteration triples.
        ns_steps: Newton–Schulz iterations.
        ns_dtype: dtype of the Newton–Schulz matmuls: ``torch.bfloat16`` (default) or
            ``torch.float32`` (and fp16 / fp64), or its name ``"bf16"``, ``"fp32"``, ...
        ns_eps: added to the Frobenius norm before normalising (default: the preset's).
        ns_algorithm: how Newton–Schulz is evaluated: ``"auto"`` (default: per matrix
            shape, the cheaper of the two on the device, :mod:`muon_compile.ns.cost`),
            ``"textbook"`` or ``"gram"`` (on the Gram matrix ``X X^T``).
        adjust_lr: shape scaling of the Muon step: ``"original"`` sqrt(max(1, rows/cols)),
            ``"match_rms_adamw"`` 0.2 sqrt(max(rows, cols)), ``"spectral"`` sqrt(max(rows,
            cols)) or ``"none"``. Rows and cols are the last two dimensions.
        extra_scale_factor: a further constant multiplier of the Muon step.
        normuon_beta2: turn on NorMuon-style variance reduction (nanochat): a factored
            second moment (one value per row of a matrix with rows >= cols, else per
            column), an EMA with this beta of the orthogonalised update's mean square,
            divides the update, which is then rescaled to its Frobenius norm. ``None``
            (default) is off; nanochat uses 0.95.
        cautious_weight_decay: apply the weight decay only where the update and the
            parameter have the same sign (nanochat). Off by default.
        qk_clip: QK-clip (MuonClip): a :class:`muon_compile.QKClip` naming each attention
            layer's query and key weights (parameters must be given with names); then
            ``step(qk_logits={layer: max_logit_per_head})`` rescales the heads above the
            threshold after the update. See :mod:`muon_compile.optim.qk_clip`.
        offload_state: keep the optimizer state in host memory between steps (pinned when
            CUDA is available); each step copies it to the parameters' device and back.
            Results are identical to no offload. See :mod:`muon_compile.optim.offload`.
        split_rows: orthogonalise row blocks of each matrix on their own (Megatron's
            ``split_qkv`` / ``qkv_split_shapes``): ``(q_rows, k_rows, v_rows)`` for a fused
            QKV weight, or an int ``k`` for blocks of ``k`` rows (per-head NS). Each block
            gets its own ``adjust_lr`` ratio. Meant for a group of its own (the QKV weights).
        skip_nonfinite: skip the whole step (every parameter and all state unchanged)
            when any gradient holds a NaN or an infinity, and count it in each param
            group's ``"skipped_steps"`` (a 0-D int64 tensor, saved with the state dict;
            :attr:`skipped_steps`). One fused check over all gradients (their fp32 L2
            norms, so a norm beyond fp32's range also counts), agreed across the ranks
            of every sharded DTensor's mesh (one scalar all-reduce), no host sync: a
            skipped step still runs, with its updates gated off. Off by default: a
            non-finite gradient then propagates as in eager PyTorch.
        tp_mode: how a matrix sharded on a tensor-parallel mesh dimension (one named in
            ``MUON_COMPILE_TP_DIMS``, default ``"tp"``) is orthogonalised: ``"distributed"``
            (the whole matrix, by owner), ``"duplicated"`` (the whole matrix on every rank
            of its group) or ``"blockwise"`` (each tensor-parallel block alone, with no
            communication across the tensor-parallel dimension: a different optimizer, not
            Muon's exact update). ``None`` (default): ``MUON_COMPILE_TP_MODE``, itself
            ``"distributed"`` by default. See :mod:`muon_compile.distributed.routing`.
        adamw_lr, adamw_betas, adamw_eps, adamw_weight_decay: AdamW group defaults.

    Muon parameters must be real 2-D matrices or 3-D stacks of matrices (the leading
    dimension is a batch, e.g. experts); anything else raises ``ValueError`` naming it.

    Plain 2-D matrices of one shape, dtype and device in a Muon group step together as a
    stack (:mod:`muon_compile.optim.stacks`): their state is one stacked tensor and
    ``self.state[p]`` holds views of it; change state in place (with ``offload_state``
    the stacked state is what moves). DTensors and 3-D parameters step one by one.
    """

    def __init__(
        self,
        params: Iterable[dict],
        *,
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        weight_decay: float = 0.0,
        ns_coefficients: coeffs.CoefficientSpec = "keller",
        ns_steps: int = 5,
        ns_dtype: torch.dtype | str = torch.bfloat16,
        ns_eps: float | None = None,
        ns_algorithm: str = "auto",
        adjust_lr: str = "original",
        extra_scale_factor: float = 1.0,
        normuon_beta2: float | None = None,
        cautious_weight_decay: bool = False,
        split_rows: int | tuple[int, ...] | None = None,
        qk_clip: QKClip | None = None,
        offload_state: bool = False,
        skip_nonfinite: bool = False,
        tp_mode: str | None = None,
        adamw_lr: float = 3e-4,
        adamw_betas: tuple[float, float] = (0.9, 0.95),
        adamw_eps: float = 1e-8,
        adamw_weight_decay: float = 0.0,
    ) -> None:
        self._kind_defaults = {
            "muon": dict(
                lr=lr,
                momentum=momentum,
                nesterov=nesterov,
                weight_decay=weight_decay,
                ns_coefficients=ns_coefficients,
                ns_steps=ns_steps,
                ns_dtype=ns_dtype,
                ns_eps=ns_eps,
                ns_algorithm=ns_algorithm,
                adjust_lr=adjust_lr,
                extra_scale_factor=extra_scale_factor,
                normuon_beta2=normuon_beta2,
                cautious_weight_decay=cautious_weight_decay,
                tp_mode=tp_mode,
                split_rows=split_rows,
            ),
            "adamw": dict(lr=adamw_lr, betas=adamw_betas, eps=adamw_eps, weight_decay=adamw_weight_decay),
        }
        self._offload = bool(offload_state)  # read while the groups below are added
        self._skip_nonfinite = bool(skip_nonfinite)  # likewise
        self._stacks: list[stacks_mod.GroupStacks] = []  # per param group
        super().__init__(params, defaults={})
        self._qk_clip = qk_clip
        self._qk_targets = None
        if qk_clip is not None:
            named = {n: p for g in self.param_groups for n, p in zip(g.get("param_names", ()), g["params"])}
            self._qk_targets = qk_clip_mod.resolve(qk_clip, named)

    # ----------------------------------------------------------------- param groups
    def add_param_group(self, param_group: dict) -> None:
        """Validate a group, fill its kind's defaults, store scalars as 0-D tensors, create state."""
        kind = param_group.get("kind")
        if kind not in KINDS:
            raise ValueError(f"param group 'kind' must be one of {KINDS}, got {kind!r}")
        for key, value in self._kind_defaults[kind].items():
            param_group.setdefault(key, value)
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if self._skip_nonfinite:
            group.setdefault("skipped_steps", torch.zeros((), dtype=torch.int64, device=_device_of(group)))
        if kind == "muon":
            self._prepare_muon_group(group)
        else:
            self._prepare_adamw_group(group)
        self._stacks.append(self._group_stacks(group))
        self._mark_static()

    def _group_stacks(self, group: dict) -> stacks_mod.GroupStacks:
        """The stacked layout of a Muon group's state (:mod:`muon_compile.optim.stacks`); no stacks
        for AdamW groups."""
        if group["kind"] != "muon":
            return stacks_mod.GroupStacks([], tuple(range(len(group["params"]))))
        layout = stacks_mod.group_stacks(group["params"])
        self._restack(group, layout)
        return layout

    def _restack(self, group: dict, layout: stacks_mod.GroupStacks) -> None:
        """Stack the state of ``layout``'s stacks (in host memory with ``offload_state``)."""
        place = offload.to_host if self._offload else None
        for stack in layout.stacks:
            stacks_mod.restack(stack, group["params"], self.state, place)

    def _prepare_muon_group(self, group: dict) -> None:
        coeffs.resolve(group["ns_coefficients"])
        if not isinstance(group["ns_steps"], int) or group["ns_steps"] < 1:
            raise ValueError(f"ns_steps must be a positive int, got {group['ns_steps']!r}")
        group["ns_dtype"] = _ns_dtype(group["ns_dtype"])
        check_algorithm(group["ns_algorithm"], "ns_algorithm")
        if group["tp_mode"] is not None:
            group["tp_mode"] = config.TPMode.parse(group["tp_mode"], "tp_mode").value
        group["adjust_lr"] = AdjustLR.check(group["adjust_lr"], "adjust_lr")
        if group["ns_eps"] is not None and not group["ns_eps"] >= 0:
            raise ValueError(f"ns_eps must be >= 0, got {group['ns_eps']!r}")
        for key in _MUON_SCALARS:
            group[key] = _scalar(group[key], key)
        if group["normuon_beta2"] is not None:
            group["normuon_beta2"] = _scalar(group["normuon_beta2"], "normuon_beta2")
            if not 0 <= _value(group["normuon_beta2"]) < 1:
                raise ValueError(f"normuon_beta2 must be in [0, 1), got {_value(group['normuon_beta2'])}")
        self._check_ranges(group, momentum_key="momentum")
        for i, p in enumerate(group["params"]):
            if group["split_rows"] is not None and p.dim() in (2, 3):
                self._check_split(group, i)
            if p.dim() not in (2, 3):
                raise ValueError(
                    f"Muon parameter {_param_name(group, i)} has {p.dim()} dimension(s); Muon takes "
                    "2-D matrices or 3-D stacks of matrices: put it in an 'adamw' group"
                )
            self._check_real(group, i)
            prepare(p, group["tp_mode"])  # the process group of several sharded mesh dimensions, made here on every rank
            layout = layout_of(p, group["tp_mode"])
            if layout.kind is Kind.DTENSOR:
                log.info("Muon parameter %s: %s; %s (one collective per matrix)", _param_name(group, i), layout.reason, layout.kind.value)
                counters["route.dtensor_fallback"] += 1
            elif layout.reason is not None:
                log.info("Muon parameter %s: %s", _param_name(group, i), layout.reason)
            self.state[p].setdefault("momentum_buffer", torch.zeros_like(p, memory_format=torch.preserve_format))
            if group["normuon_beta2"] is not None:
                self.state[p].setdefault("second_moment", _zeros_like_factored(p))
            self._offload_state_of(p)

    def _prepare_adamw_group(self, group: dict) -> None:
        for key in _ADAMW_SCALARS:
            group[key] = _scalar(group[key], key)
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair, got {betas!r}")
        group["betas"] = (_scalar(betas[0], "betas[0]"), _scalar(betas[1], "betas[1]"))
        self._check_ranges(group, momentum_key=None)
        for i, p in enumerate(group["params"]):
            self._check_real(group, i)
            state = self.state[p]
            state.setdefault("step", torch.zeros((), dtype=torch.float32, device=p.device))
            state.setdefault("exp_avg", torch.zeros_like(p, memory_format=torch.preserve_format))
            state.setdefault("exp_avg_sq", torch.zeros_like(p, memory_format=torch.preserve_format))
            self._offload_state_of(p)

    @staticmethod
    def _check_ranges(group: dict, momentum_key: str | None) -> None:
        if _value(group["lr"]) < 0:
            raise ValueError(f"lr must be >= 0, got {_value(group['lr'])}")
        if _value(group["weight_decay"]) < 0:
            raise ValueError(f"weight_decay must be >= 0, got {_value(group['weight_decay'])}")
        if momentum_key is not None and not 0 <= _value(group[momentum_key]) < 1:
            raise ValueError(f"momentum must be in [0, 1), got {_value(group[momentum_key])}")
        if "betas" in group and not all(0 <= _value(b) < 1 for b in group["betas"]):
            raise ValueError(f"betas must be in [0, 1), got {[_value(b) for b in group['betas']]}")

    @staticmethod
    def _check_split(group: dict, index: int) -> None:
        split, rows = group["split_rows"], group["params"][index].shape[-2]
        sizes = split if isinstance(split, (tuple, list)) else None
        if sizes is None and not (isinstance(split, int) and split > 0 and rows % split == 0):
            raise ValueError(f"split_rows={split!r} does not divide the {rows} rows of Muon parameter {_param_name(group, index)}")
        if sizes is not None and (not all(isinstance(r, int) and r > 0 for r in sizes) or sum(sizes) != rows):
            raise ValueError(f"split_rows={split!r} does not sum to the {rows} rows of Muon parameter {_param_name(group, index)}")

    @staticmethod
    def _check_real(group: dict, index: int) -> None:
        p = group["params"][index]
        if torch.is_complex(p) or not p.dtype.is_floating_point:
            raise ValueError(f"parameter {_param_name(group, index)} has dtype {p.dtype}; only real floating point is supported")

    @staticmethod
    def _check_grad(group: dict, index: int, grad: Tensor) -> None:
        if grad.is_sparse:
            raise ValueError(f"parameter {_param_name(group, index)} has a sparse gradient; it is not supported")
        if torch.is_complex(grad):
            raise ValueError(f"parameter {_param_name(group, index)} has a complex gradient; it is not supported")

    def _offload_state_of(self, p: Tensor) -> None:
        """With ``offload_state``: move ``p``'s state (but 0-D entries) to host memory."""
        if self._offload:
            state = self.state[p]
            for key, value in state.items():
                if value.dim() > 0:
                    state[key] = offload.to_host(value)

    def _step_state(self, state: dict, device: torch.device) -> dict:
        """The state a step updates: ``state`` itself, or with ``offload_state`` its copy on ``device``."""
        if not self._offload:
            return state
        return {k: offload.stage(v, device) if v.dim() > 0 else v for k, v in state.items()}

    def _end_step_state(self, state: dict, staged: dict) -> None:
        if self._offload:
            for key, value in state.items():
                if value.dim() > 0:
                    offload.write_back(value, staged[key])

    def __getstate__(self) -> dict:
        """What ``copy.deepcopy`` and ``pickle`` copy: everything the optimizer holds (its
        settings, stacks and state; ``torch.optim.Optimizer``'s own names only defaults, state and
        param groups, which left a copy without its stacks), but a compiled step
        (:func:`muon_compile.compile_step`): a copy is uncompiled, as ``torch.optim``'s are."""
        return without_compiled_step(self.__dict__)

    def state_dict(self) -> dict:
        """Like ``torch.optim.Optimizer.state_dict``; with ``offload_state`` on CUDA it first
        waits for the last step's non-blocking copies into (pinned) host memory."""
        if self._offload and torch.cuda.is_available():
            torch.cuda.synchronize()
        return super().state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """Load like ``torch.optim.Optimizer``, then restore 0-D tensor hyper-parameters
        (and, with ``offload_state``, put the state back in host memory).

        Before anything is loaded, every state tensor of ``state_dict`` is checked against
        the state this optimizer holds for the same parameter (made at construction, so
        for every parameter and key): a different shape, dtype, or DTensor placement
        raises ``ValueError`` naming the parameter, the key and both values, and leaves the
        optimizer as it was (e.g. a checkpoint of a model of another width)."""
        self._check_loadable(state_dict)
        super().load_state_dict(state_dict)
        for p in self.state:
            self._offload_state_of(p)
        for group, layout in zip(self.param_groups, self._stacks):
            self._restack(group, layout)
        for group in self.param_groups:
            for key, value in self._kind_defaults[group["kind"]].items():  # a setting newer than the checkpoint
                group.setdefault(key, value)
            keys = _MUON_SCALARS if group["kind"] == "muon" else _ADAMW_SCALARS
            for key in keys:
                group[key] = _scalar(group[key], key)
            if group["kind"] == "adamw":
                group["betas"] = tuple(_scalar(b, "betas") for b in group["betas"])
            if self._skip_nonfinite:
                group.setdefault("skipped_steps", torch.zeros((), dtype=torch.int64))
                group["skipped_steps"] = group["skipped_steps"].to(_device_of(group))
            if group["kind"] == "adamw":
                for p in group["params"]:
                    self.state[p]["step"] = self.state[p]["step"].to(p.device)
        self._mark_static()

    def _mark_static(self) -> None:
        """Mark the state tensors on CUDA as static addresses, as torch.optim's optimizers
        have Dynamo do: a step replayed as a CUDA graph then updates them where they are
        instead of copying them in and out. Dynamo guards on their identity, so state
        loaded from a checkpoint (new tensors) recompiles the step: a new capture, not a
        stale one."""
        stacked = [t for layout in self._stacks for stack in layout.stacks for t in stack.state.values()]
        for t in [*stacked, *(t for state in self.state.values() for t in state.values())]:
            if isinstance(t, Tensor) and t.device.type == "cuda":
                torch._dynamo.mark_static_address(t, guard=True)

    def _check_loadable(self, state_dict: dict) -> None:
        """Raise ``ValueError`` at the first saved state tensor that does not fit (see
        :meth:`load_state_dict`); group and parameter counts are torch's own check."""
        saved_state = state_dict.get("state", {})
        for group, saved_group in zip(self.param_groups, state_dict.get("param_groups", ())):
            for i, (p, saved_id) in enumerate(zip(group["params"], saved_group.get("params", ()))):
                for key, saved in saved_state.get(saved_id, {}).items():
                    mine = self.state[p].get(key)
                    if isinstance(saved, Tensor) and isinstance(mine, Tensor):
                        problem = _state_mismatch(saved, mine)
                        if problem:
                            raise ValueError(
                                f"cannot load optimizer state {key!r} of parameter {_param_name(group, i)}: {problem}"
                            )

    # ------------------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure=None, qk_logits: dict[str, Tensor] | None = None):
        """Perform one optimisation step; ``closure`` re-evaluates the loss, as in ``torch.optim``.

        ``qk_logits`` (with ``qk_clip`` configured): per attention layer name, the largest
        pre-softmax logit of each head in this step's batch, shape ``(heads,)``, the same on
        every rank (all-reduce it with MAX under data parallelism). Heads above the
        threshold get their query and key rows rescaled after the update.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        live = self._live() if self._skip_nonfinite else None
        for group, layout in zip(self.param_groups, self._stacks):
            if live is not None:
                group["skipped_steps"].add_((1 - live).to(torch.int64))
                group = _gated(group, live)
            if group["kind"] == "muon":
                self._muon_step(group, layout)
            else:
                self._adamw_step(group, live)
        if qk_logits is not None:
            if self._qk_targets is None:
                raise ValueError("step(qk_logits=...) needs the optimizer built with qk_clip=QKClip(...)")
            qk_clip_mod.apply(self._qk_targets, qk_logits, self._qk_clip.threshold, live)
        return loss

    @property
    def skipped_steps(self) -> Tensor:
        """Steps skipped for a non-finite gradient (``skip_nonfinite=True``), a 0-D tensor."""
        if not self._skip_nonfinite:
            raise ValueError("skipped_steps is counted only by an optimizer built with skip_nonfinite=True")
        return self.param_groups[0]["skipped_steps"]

    def _live(self) -> Tensor:
        """1.0 when every gradient is finite on every rank, else 0.0 (0-D float32, no host sync)."""
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return torch.ones((), dtype=torch.float32)
        local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        norms = torch._foreach_norm(local, 2, dtype=torch.float32)
        live = torch.stack(norms).sum().isfinite().to(torch.float32)
        meshes = {id(g.device_mesh): g.device_mesh for g in grads if isinstance(g, DTensor)}
        for mesh in meshes.values():
            for dim in range(mesh.ndim):
                if mesh.size(dim) > 1:
                    live = funcol.all_reduce(live, "min", (mesh, dim))
        return live

    def _grad(self, p: Tensor) -> Tensor:
        """``p``'s gradient as a step reads it: with ``skip_nonfinite``, NaN and inf as 0,
        so that a skipped step, whose updates are gated off, computes with finite values."""
        if self._skip_nonfinite:
            return torch.nan_to_num(p.grad, nan=0.0, posinf=0.0, neginf=0.0)
        return p.grad

    def _muon_step(self, group: dict, layout: stacks_mod.GroupStacks) -> None:
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
                self._muon_stack_step(group, stack, members, ns_args, decay)
            else:  # each member with a gradient steps on its own, on its views of the state
                for i in stack.indices:
                    self._muon_param_step(group, i, ns_args, decay)
        for i in layout.loose:
            self._muon_param_step(group, i, ns_args, decay)

    def _muon_param_step(self, group: dict, index: int, ns_args: NSArgs, decay: Tensor) -> None:
        p = group["params"][index]
        if p.grad is None:
            return
        self._check_grad(group, index, p.grad)
        state = self._step_state(self.state[p], p.device)
        split, lr_scale = self._split_and_scale(group, p.shape)
        muon_update(
            p,
            self._grad(p),
            state["momentum_buffer"],
            **self._direction_args(group, split, ns_args),
            second_moment=state.get("second_moment"),
            decay=decay,
            lr=group["lr"],
            lr_scale=lr_scale,
            cautious=group["cautious_weight_decay"],
        )
        self._end_step_state(self.state[p], state)

    def _muon_stack_step(
        self, group: dict, stack: stacks_mod.ParamStack, members: list[Tensor], ns_args: NSArgs, decay: Tensor
    ) -> None:
        """One step of a stack (:mod:`muon_compile.optim.stacks`): the direction of the stacked
        gradients, then one write into the members."""
        for i, p in zip(stack.indices, members):
            self._check_grad(group, i, p.grad)
        split, lr_scale = self._split_and_scale(group, members[0].shape)
        state = self._step_state(stack.state, members[0].device)
        ortho = muon_direction(
            stacks_mod.stack([self._grad(p) for p in members]),
            state["momentum_buffer"],
            **self._direction_args(group, split, ns_args),
            second_moment=state.get("second_moment"),
        )
        self._end_step_state(stack.state, state)
        stacks_mod.write(members, decay, ortho, group["lr"], lr_scale, cautious=group["cautious_weight_decay"])

    @staticmethod
    def _split_and_scale(group: dict, shape: torch.Size) -> tuple[tuple[int, ...] | None, float]:
        """Row blocks of a matrix of ``shape`` and its step's scale (``adjust_lr`` ratio
        unless split, times ``extra_scale_factor``)."""
        split = _row_blocks(group["split_rows"], shape[-2])
        ratio = 1.0 if split else lr_ratio(shape[-2], shape[-1], group["adjust_lr"])
        return split, group["extra_scale_factor"] * ratio

    @staticmethod
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

    def _adamw_step(self, group: dict, live: Tensor | None) -> None:
        beta1, beta2 = group["betas"]
        for i, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            self._check_grad(group, i, p.grad)
            state = self._step_state(self.state[p], p.device)
            adamw_update(
                p,
                self._grad(p),
                state["exp_avg"],
                state["exp_avg_sq"],
                state["step"],
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                eps=group["eps"],
                weight_decay=group["weight_decay"],
                live=live,
            )
            self._end_step_state(self.state[p], state)


def _device_of(group: dict) -> torch.device:
    """Where a group's counters live: its parameters' device (the CPU for an empty group),
    so that a step on a GPU writes no CPU tensor and can be captured as a CUDA graph."""
    return group["params"][0].device if group["params"] else torch.device("cpu")


def _gated(group: dict, live: Tensor) -> dict:
    """A Muon group's view for a step that ``live`` (0-D, 1 or 0) may skip: learning rate
    times ``live`` (no update, no weight decay), momentum and NorMuon's beta 1 when
    skipped (state kept). An AdamW group is gated inside :func:`adamw_update`."""
    if group["kind"] != "muon":
        return group
    gated = {**group, "lr": group["lr"] * live, "momentum": gate(group["momentum"], live, 1.0)}
    if group["normuon_beta2"] is not None:
        gated["normuon_beta2"] = gate(group["normuon_beta2"], live, 1.0)
    return gated


class Muon(MuonAdamW):
    """Muon (MomentUm Orthogonalized by Newton–Schulz) for 2-D / 3-D parameters.

    ``Muon(params, lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.0,
    ns_coefficients="keller", ns_steps=5, ns_dtype=torch.bfloat16, adjust_lr="original")``;
    ``params`` is an iterable of tensors, of ``(name, tensor)`` pairs, or of param-group
    dicts. See :class:`MuonAdamW` for every argument.
    """

    def __init__(self, params: Iterable, **kwargs: Any) -> None:
        params = list(params)
        if params and not isinstance(params[0], dict):
            params = [{"params": params}]
        groups = []
        for group in params:
            if group.get("kind", "muon") != "muon":
                raise ValueError(f"Muon takes only muon param groups, got kind {group['kind']!r}; use MuonAdamW")
            groups.append({**group, "kind": "muon"})
        super().__init__(groups, **kwargs)

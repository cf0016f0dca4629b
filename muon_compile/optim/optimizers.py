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

The optimizer composes three parts, each its own module: the param groups' defaults and
validation (:mod:`~muon_compile.optim.groups`), the state with its stacking, offload and
checkpoint checks (:mod:`~muon_compile.optim.state`), and each kind's step
(:mod:`~muon_compile.optim.step_rules`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from ..compile.compile_step import without_compiled_step
from ..ns import coefficients as coeffs
from . import groups, step_rules
from . import qk_clip as qk_clip_mod
from . import stacks as stacks_mod
from . import state as state_mod
from .qk_clip import QKClip


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
        self._store = state_mod.StateStore(offload=bool(offload_state))  # read while the groups below are added
        self._skip_nonfinite = bool(skip_nonfinite)  # likewise
        self._stacks: list[stacks_mod.GroupStacks] = []  # per param group
        super().__init__(params, defaults={})
        self._qk_clip = qk_clip
        self._qk_targets = None
        if qk_clip is not None:
            named = {n: p for g in self.param_groups for n, p in zip(g.get("param_names", ()), g["params"])}
            self._qk_targets = qk_clip_mod.resolve(qk_clip, named)

    def add_param_group(self, param_group: dict) -> None:
        """Validate a group, fill its kind's defaults, store scalars as 0-D tensors, create state."""
        for key, value in self._kind_defaults[groups.check_kind(param_group)].items():
            param_group.setdefault(key, value)
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        groups.prepare(group, self._skip_nonfinite)
        self._stacks.append(self._store.create(group, self.state))
        state_mod.mark_static(self._stacks, self.state)

    def __getstate__(self) -> dict:
        """What ``copy.deepcopy`` and ``pickle`` copy: everything the optimizer holds (its
        settings, stacks and state; ``torch.optim.Optimizer``'s own names only defaults, state and
        param groups, which left a copy without its stacks), but a compiled step
        (:func:`muon_compile.compile_step`): a copy is uncompiled, as ``torch.optim``'s are."""
        return without_compiled_step(self.__dict__)

    def state_dict(self) -> dict:
        """Like ``torch.optim.Optimizer.state_dict``; with ``offload_state`` on CUDA it first
        waits for the last step's non-blocking copies into (pinned) host memory."""
        if self._store.offload and torch.cuda.is_available():
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
        state_mod.check_loadable(self.param_groups, self.state, state_dict)
        super().load_state_dict(state_dict)
        for group, layout in zip(self.param_groups, self._stacks):
            self._store.reload(group, layout, self.state)
            groups.restore(group, self._kind_defaults[group["kind"]], self._skip_nonfinite)
        state_mod.mark_static(self._stacks, self.state)

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
        live = step_rules.live(self.param_groups) if self._skip_nonfinite else None
        for group, layout in zip(self.param_groups, self._stacks):
            if live is not None:
                group["skipped_steps"].add_((1 - live).to(torch.int64))
                group = step_rules.gated(group, live)
            if group["kind"] == "muon":
                step_rules.muon_step(group, layout, self.state, self._store, self._skip_nonfinite)
            else:
                step_rules.adamw_step(group, self.state, self._store, self._skip_nonfinite, live)
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

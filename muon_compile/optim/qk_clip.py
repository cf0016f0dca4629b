"""QK-clip (MuonClip, Kimi K2): after the update, shrink the query and key weights of each
attention head whose largest pre-softmax logit exceeded a threshold.

For head ``h`` with maximum logit ``S_h`` (over the step's batch) and threshold ``t``,
``g_h = min(1, t / S_h)``; the rows of head ``h`` in the query weight and in the key
weight are multiplied by ``sqrt(g_h)``, so the head's logits shrink by ``g_h``. The MLA
variant (``rope_dim > 0``): only per-head parts are clipped; the query's per-head rotary
rows are multiplied by ``g_h`` (the shared rotary key is not touched, so those logits
shrink by ``g_h`` too) and the key weight holds only the per-head non-rotary rows.

Layout, per attention layer: the query weight has ``heads * head_dim`` rows, head by head
(the last ``rope_dim`` rows of each head's block are rotary); the key weight has
``heads * (head_dim - rope_dim)`` rows, head by head.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from .updates import gate


@dataclasses.dataclass(frozen=True)
class QKClipLayer:
    """One attention layer: the names of its query and key weights (as given to the optimizer)."""

    name: str
    query: str
    key: str
    heads: int
    head_dim: int
    rope_dim: int = 0


@dataclasses.dataclass(frozen=True)
class QKClip:
    """QK-clip configuration: ``threshold`` and the layers it applies to."""

    threshold: float
    layers: Sequence[QKClipLayer]


@dataclasses.dataclass(frozen=True)
class _Target:
    """A weight to rescale: per-head row pattern, and this rank's rows of it."""

    param: Tensor
    rows_per_head: int
    rope_rows: int  # rows at the end of each head's block scaled by g instead of sqrt(g)
    local: tuple[int, int]  # (first row, rows) held by this rank


def _local_rows(p: Tensor) -> tuple[int, int]:
    if not isinstance(p, DTensor):
        return 0, p.shape[0]
    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return offset[0], shape[0]


def resolve(config: QKClip, named: Mapping[str, Tensor]) -> dict[str, tuple[_Target, _Target]]:
    """Each layer's (query, key) targets; ``ValueError`` naming a missing or misshapen weight."""
    if not config.threshold > 0:
        raise ValueError(f"qk_clip threshold must be > 0, got {config.threshold!r}")
    out = {}
    for layer in config.layers:
        pair = []
        for role, pname, per_head, rope in (
            ("query", layer.query, layer.head_dim, layer.rope_dim),
            ("key", layer.key, layer.head_dim - layer.rope_dim, 0),
        ):
            if pname not in named:
                raise ValueError(
                    f"qk_clip layer {layer.name!r}: {role} weight {pname!r} is not a parameter of this optimizer "
                    "(give parameters as (name, tensor) pairs, e.g. via muon_param_groups)"
                )
            p = named[pname]
            if p.dim() != 2 or p.shape[0] != layer.heads * per_head:
                raise ValueError(
                    f"qk_clip layer {layer.name!r}: {role} weight {pname!r} has shape {tuple(p.shape)}, "
                    f"expected {layer.heads} heads x {per_head} rows"
                )
            pair.append(_Target(p, per_head, rope, _local_rows(p)))
        out[layer.name] = (pair[0], pair[1])
    return out


def _row_scale(target: _Target, gamma: Tensor) -> Tensor:
    """This rank's ``(rows, 1)`` multipliers of ``target``'s weight, as the weight's kind of tensor."""
    per_row = gamma.sqrt()[:, None].expand(-1, target.rows_per_head)
    if target.rope_rows:
        per_row = torch.cat([per_row[:, : -target.rope_rows], gamma[:, None].expand(-1, target.rope_rows)], dim=1)
    first, rows = target.local
    scale = per_row.reshape(-1, 1)[first : first + rows].to(target.param.dtype)
    p = target.param
    if isinstance(p, DTensor):
        return DTensor.from_local(scale, p.device_mesh, p.placements, run_check=False, shape=(p.shape[0], 1), stride=(1, 1))
    return scale


@torch.no_grad()
def apply(
    targets: dict[str, tuple[_Target, _Target]],
    qk_logits: Mapping[str, Tensor],
    threshold: float,
    live: Tensor | None = None,
) -> None:
    """Rescale the query / key rows of every head whose logit in ``qk_logits[layer]`` (shape
    ``(heads,)``, the same on every rank) exceeds ``threshold``; nothing where the 0-D
    ``live`` is 0 (a step skipped for a non-finite gradient)."""
    unknown = set(qk_logits) - set(targets)
    if unknown:
        raise ValueError(f"qk_logits names unknown qk_clip layer(s) {sorted(unknown)}; configured: {sorted(targets)}")
    for name, logits in qk_logits.items():
        query, key = targets[name]
        gamma = threshold / logits.double().clamp_min(threshold)  # 1 where the head is under the threshold
        if live is not None:
            gamma = gate(gamma, live, 1.0)
        for target in (query, key):
            target.param.mul_(_row_scale(target, gamma))

"""The usual split of a model's parameters between Muon and AdamW."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

DEFAULT_HEAD_NAMES = ("lm_head", "head", "output", "classifier")


def muon_param_groups(
    model: nn.Module,
    *,
    head_names: Iterable[str] = DEFAULT_HEAD_NAMES,
    expert_keys: Iterable[str] | None = None,
) -> list[dict]:
    """Split ``model``'s parameters into a ``"muon"`` and an ``"adamw"`` group for :class:`MuonAdamW`.

    AdamW takes embeddings (``nn.Embedding`` / ``nn.EmbeddingBag`` weights and any
    parameter tied to them), the output head (parameters of a module whose own name is
    in ``head_names``), convolution weights, and every 0-D / 1-D parameter. Muon takes the
    remaining 2-D matrices and 3-D stacks of matrices (e.g. expert weights).

    With ``expert_keys``, a 3-D parameter is an expert stack ``(E, out, in)`` only if its
    name contains one of the keys; those form a Muon group of their own
    (``"experts": True``, orthogonalised per expert in one batched call; set its own
    ``lr`` etc. there), and any other 3-D parameter goes to AdamW. Parameters are given
    as ``(name, tensor)`` pairs so errors name them; empty groups are dropped.
    """
    heads = set(head_names)
    adamw_ids: set[int] = set()
    for module_name, module in model.named_modules():
        own_name = module_name.rsplit(".", 1)[-1]
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) or own_name in heads:
            adamw_ids.update(id(p) for p in module.parameters(recurse=False))
        if isinstance(module, nn.modules.conv._ConvNd):
            adamw_ids.update(id(p) for p in module.parameters(recurse=False))
    keys = None if expert_keys is None else tuple(expert_keys)
    muon, experts, adamw = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.dim() not in (2, 3) or id(p) in adamw_ids:
            adamw.append((name, p))
        elif p.dim() == 2 or keys is None:
            muon.append((name, p))
        else:
            (experts if any(k in name for k in keys) else adamw).append((name, p))
    groups = [
        {"params": muon, "kind": "muon"},
        {"params": experts, "kind": "muon", "experts": True},
        {"params": adamw, "kind": "adamw"},
    ]
    return [g for g in groups if g["params"]]

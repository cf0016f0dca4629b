"""The usual split of a model's parameters between Muon and AdamW."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

DEFAULT_HEAD_NAMES = ("lm_head", "head", "output", "classifier")


def muon_param_groups(
    model: nn.Module, *, head_names: Iterable[str] = DEFAULT_HEAD_NAMES
) -> list[dict]:
    """Split ``model``'s parameters into a ``"muon"`` and an ``"adamw"`` group for :class:`MuonAdamW`.

    AdamW takes embeddings (``nn.Embedding`` / ``nn.EmbeddingBag`` weights and any
    parameter tied to them), the output head (parameters of a module whose own name is
    in ``head_names``), convolution weights, and every 0-D / 1-D parameter. Muon takes the
    remaining 2-D matrices and 3-D stacks of matrices (e.g. expert weights). Parameters
    are given as ``(name, tensor)`` pairs so errors name them; empty groups are dropped.
    """
    heads = set(head_names)
    adamw_ids: set[int] = set()
    for module_name, module in model.named_modules():
        own_name = module_name.rsplit(".", 1)[-1]
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) or own_name in heads:
            adamw_ids.update(id(p) for p in module.parameters(recurse=False))
        if isinstance(module, nn.modules.conv._ConvNd):
            adamw_ids.update(id(p) for p in module.parameters(recurse=False))
    muon, adamw = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_matrix = p.dim() in (2, 3) and id(p) not in adamw_ids
        (muon if is_matrix else adamw).append((name, p))
    groups = [{"params": muon, "kind": "muon"}, {"params": adamw, "kind": "adamw"}]
    return [g for g in groups if g["params"]]

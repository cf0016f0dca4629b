"""The matrices Muon updates in models too large for this machine, from their published
configurations: the input of the planner (:mod:`muon_compile.planner.recommend`).

A :class:`ModelShapes` lists its Muon matrices as ``(rows, cols)`` = ``(out, in)``, the
layout of ``nn.Linear.weight`` that FSDP2 shards by rows, in layer order; embeddings and
the output head are left to AdamW, as every Muon recipe does. ``active`` is the number of
parameters one token passes through (all of them for a dense model), which prices the
forward and backward pass of a training step at ``6 * active`` FLOPs per token.
``tp_split`` says, per matrix, which dimension tensor parallelism shards in Megatron's layout
(torchtitan's plan): 0, the rows, for the column-parallel q, k, v, gate and up projections;
1, the columns, for the row-parallel attention output and down projection.

Models (the Llama entries from Meta's published ``config.json`` of each release):

* ``llama-1b``: Llama 3.2 1B: hidden 2048, 16 layers, 32 query and 8 key/value heads of
  64, FFN 8192, vocabulary 128,256 (tied embedding).
* ``llama-8b``: Llama 3.1 8B: hidden 4096, 32 layers, 32 / 8 heads of 128, FFN 14,336,
  vocabulary 128,256.
* ``llama-70b``: Llama 3.1 70B: hidden 8192, 80 layers, 64 / 8 heads of 128, FFN
  28,672, vocabulary 128,256.
* ``moe-16x1b``: a made-up mixture of experts for the planner: ``llama-1b``'s attention
  and each layer's FFN replaced by 16 experts of ``llama-1b``'s FFN size, 2 active per
  token (Mixtral's routing). Each expert matrix is its own FSDP2-sharded parameter here.
"""

from __future__ import annotations

import dataclasses

Shape = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class ModelShapes:
    """A model's Muon matrices and parameter counts (see the module docstring)."""

    name: str
    source: str
    matrices: tuple[Shape, ...]
    active: int  # parameters a token passes through, embeddings and head included
    tp_split: tuple[int, ...] = ()  # per matrix, the dimension tensor parallelism shards

    @property
    def muon_params(self) -> int:
        return sum(r * c for r, c in self.matrices)


def _layer(hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, experts: int = 1) -> list[tuple[Shape, int]]:
    """A layer's matrices, each with the dimension tensor parallelism shards."""
    kv = kv_heads * head_dim
    attention = [((heads * head_dim, hidden), 0), ((kv, hidden), 0), ((kv, hidden), 0), ((hidden, heads * head_dim), 1)]
    return attention + [((ffn, hidden), 0), ((ffn, hidden), 0), ((hidden, ffn), 1)] * experts


def _model(name: str, source: str, layers: int, vocab: int, tied: bool, experts: int = 1, active_experts: int = 1, **dims: int) -> ModelShapes:
    hidden, ffn = dims["hidden"], dims["ffn"]
    layer = _layer(experts=experts, **dims)
    matrices = tuple(shape for shape, _ in layer) * layers
    ffn_params = 3 * hidden * ffn
    per_layer = sum(r * c for (r, c), _ in layer) - (experts - active_experts) * ffn_params
    embeddings = vocab * hidden * (1 if tied else 2)
    return ModelShapes(name, source, matrices, layers * per_layer + embeddings, tuple(d for _, d in layer) * layers)


MODELS: dict[str, ModelShapes] = {
    "llama-1b": _model(
        "llama-1b", "Llama 3.2 1B config.json", 16, 128_256, True, hidden=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192
    ),
    "llama-8b": _model(
        "llama-8b", "Llama 3.1 8B config.json", 32, 128_256, False, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14_336
    ),
    "llama-70b": _model(
        "llama-70b", "Llama 3.1 70B config.json", 80, 128_256, False, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28_672
    ),
    "moe-16x1b": _model(
        "moe-16x1b",
        "llama-1b with 16 FFN experts per layer, 2 active (made up for the planner)",
        16,
        128_256,
        True,
        experts=16,
        active_experts=2,
        hidden=2048,
        heads=32,
        kv_heads=8,
        head_dim=64,
        ffn=8192,
    ),
}


def model(name: str) -> ModelShapes:
    """The model called ``name``; ``ValueError`` naming the known ones otherwise."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS)}")
    return MODELS[name]

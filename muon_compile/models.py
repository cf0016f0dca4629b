"""The matrices Muon updates in each model this project names: one registry, :data:`MODELS`, that
the benchmarks (``scripts/bench_*.py --workload``), the GPU check and the advisor
(``python -m muon_compile.advisor --model``) read.

A :class:`Model` lists its Muon matrices as ``(rows, cols)`` = ``(out, in)``, the layout of
``nn.Linear.weight`` that FSDP2 shards by rows, in layer order; embeddings and the output head
are left to AdamW, as every Muon recipe does. ``active`` is the number of parameters one token
passes through (all of them for a dense model), which prices the forward and backward pass of a
training step at ``6 * active`` FLOPs per token. ``tp_split`` says, per matrix, which dimension
tensor parallelism shards in Megatron's layout (torchtitan's plan): 0, the rows, for the
column-parallel q, k, v (or fused QKV), gate and up projections; 1, the columns, for the
row-parallel attention output and down projection. ``large``: a CPU step takes minutes or more.

Published models (the Llama entries from Meta's ``config.json`` of each release):

* ``llama-1b``: Llama 3.2 1B: hidden 2048, 16 layers, 32 query and 8 key/value heads of 64,
  FFN 8192, vocabulary 128,256 (tied embedding).
* ``llama-8b``: Llama 3.1 8B: hidden 4096, 32 layers, 32 / 8 heads of 128, FFN 14,336,
  vocabulary 128,256; ``llama-8b-4l`` its first 4 layers.
* ``llama-70b``: Llama 3.1 70B: hidden 8192, 80 layers, 64 / 8 heads of 128, FFN 28,672.

Made up here, each for what it measures:

* ``gpt-small``: a d=384, 6-layer GPT in nanoGPT's layout (fused QKV, MLP 4d), vocabulary
  50,304 (tied); ``gpt-small-odd`` adds two matrices whose rows 2 does not divide and a
  single row (a distributed step's uneven shards).
* ``dense-1b``: a dense 1B decoder in Llama's layout with full-width attention (no grouped
  key/value heads) and FFN 5632, 16 layers; ``dense-1b-2l`` its first 2 layers.
* ``moe-16x1b``: ``llama-1b``'s attention with each layer's FFN replaced by 16 experts of its
  FFN size, 2 active per token (Mixtral's routing); each expert matrix its own parameter.
* ``many-small``: 96 small matrices of 8 shapes (64 to 384 rows or columns); ``small-14``: 14
  of widths 64, 96 and 37; ``tiny``: 4 small matrices, seconds per benchmark arm on a CPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

Shape = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Model:
    """A model's Muon matrices and parameter counts (see the module docstring)."""

    name: str
    source: str
    matrices: tuple[Shape, ...]
    active: int  # parameters a token passes through, embeddings and head included
    tp_split: tuple[int, ...] = ()  # per matrix, the dimension tensor parallelism shards
    large: bool = False

    @property
    def muon_params(self) -> int:
        return sum(r * c for r, c in self.matrices)


def _attention(hidden: int, heads: int, kv_heads: int, head_dim: int) -> list[tuple[Shape, int]]:
    kv = kv_heads * head_dim
    return [((heads * head_dim, hidden), 0), ((kv, hidden), 0), ((kv, hidden), 0), ((hidden, heads * head_dim), 1)]


def _mlp(hidden: int, ffn: int) -> list[tuple[Shape, int]]:
    return [((ffn, hidden), 0), ((ffn, hidden), 0), ((hidden, ffn), 1)]


def _decoder(
    name: str, source: str, layers: int, vocab: int, tied: bool, *, hidden: int, heads: int, kv_heads: int,
    head_dim: int, ffn: int, experts: int = 1, active_experts: int = 1, large: bool = True,
) -> Model:
    """A Llama-layout decoder: per layer q, k, v, o, then ``experts`` gated MLPs."""
    layer = _attention(hidden, heads, kv_heads, head_dim) + _mlp(hidden, ffn) * experts
    per_layer = sum(r * c for (r, c), _ in layer) - (experts - active_experts) * 3 * hidden * ffn
    embeddings = vocab * hidden * (1 if tied else 2)
    return Model(
        name, source, tuple(s for s, _ in layer) * layers, layers * per_layer + embeddings,
        tuple(d for _, d in layer) * layers, large,
    )


def _gpt(name: str, source: str, extra: Sequence[Shape] = (), d: int = 384, layers: int = 6, vocab: int = 50_304) -> Model:
    """nanoGPT's layout: per layer fused QKV (3d x d), attention out (d x d), MLP up (4d x d) and down."""
    layer = [((3 * d, d), 0), ((d, d), 1), ((4 * d, d), 0), ((d, 4 * d), 1)]
    matrices = tuple(s for s, _ in layer) * layers + tuple(extra)
    return Model(name, source, matrices, sum(r * c for r, c in matrices) + vocab * d, tuple(t for _, t in layer) * layers)


def _synthetic(name: str, source: str, shapes: Sequence[Shape], count: int | None = None) -> Model:
    """A list of matrices of no model (``count``: the shapes cycled to that many)."""
    matrices = tuple(shapes[i % len(shapes)] for i in range(count or len(shapes)))
    return Model(name, source, matrices, sum(r * c for r, c in matrices))


_LLAMA_1B = dict(hidden=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192)
_LLAMA_8B = dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14_336)
_DENSE_1B = dict(hidden=2048, heads=32, kv_heads=32, head_dim=64, ffn=5632)
_DENSE_1B_SOURCE = "a dense 1B decoder, Llama's layout with full-width attention, FFN 5632 (made up for the benchmarks)"

MODELS: dict[str, Model] = {
    m.name: m
    for m in (
        _decoder("llama-1b", "Llama 3.2 1B config.json", 16, 128_256, True, **_LLAMA_1B),
        _decoder("llama-8b", "Llama 3.1 8B config.json", 32, 128_256, False, **_LLAMA_8B),
        _decoder("llama-8b-4l", "Llama 3.1 8B config.json, its first 4 layers", 4, 128_256, False, **_LLAMA_8B),
        _decoder(
            "llama-70b", "Llama 3.1 70B config.json", 80, 128_256, False,
            hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28_672,
        ),
        _decoder(
            "moe-16x1b", "llama-1b with 16 FFN experts per layer, 2 active (made up for the advisor)", 16, 128_256, True,
            experts=16, active_experts=2, **_LLAMA_1B,
        ),
        _decoder("dense-1b", _DENSE_1B_SOURCE, 16, 32_000, False, **_DENSE_1B),
        _decoder("dense-1b-2l", _DENSE_1B_SOURCE + ", its first 2 layers", 2, 32_000, False, large=False, **_DENSE_1B),
        _gpt("gpt-small", "a d=384, 6-layer GPT in nanoGPT's layout (made up for the benchmarks)"),
        _gpt(
            "gpt-small-odd", "gpt-small plus two matrices whose rows 2 does not divide and a single row",
            extra=((1001, 384), (383, 1536), (1, 384)),
        ),
        _synthetic(
            "many-small", "96 small matrices of 8 shapes",
            ((64, 192), (192, 64), (96, 96), (128, 256), (256, 128), (64, 64), (128, 384), (384, 128)), 96,
        ),
        _synthetic("small-14", "14 matrices of widths 64, 96 and 37", ((64, 96), (96, 64), (37, 64), (64, 37), (96, 96), (37, 96), (96, 37)), 14),
        _synthetic("tiny", "4 small matrices", ((32, 16), (16, 32), (24, 24), (48, 16))),
    )
}


def model(name: str) -> Model:
    """The model called ``name``; ``ValueError`` naming the known ones otherwise."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS)}")
    return MODELS[name]


def stacks(name: str) -> list[tuple[int, int, int]]:
    """``(count, rows, cols)`` of each shape of ``name``'s matrices, in order of first appearance:
    the stacks its same-shape parameters form."""
    counts: dict[Shape, int] = {}
    for shape in model(name).matrices:
        counts[shape] = counts.get(shape, 0) + 1
    return [(n, r, c) for (r, c), n in counts.items()]

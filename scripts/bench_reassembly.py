"""How fast does Inductor's code reassemble received shards into the matrices NS stacks, and cut the results back?

    python scripts/bench_reassembly.py [--world 2 3] [--reps 15]

A distributed bucket's compute stage receives a ``[W, elements]`` grid: each rank's
padded row shards of the matrices, side by side. Three spellings of turning it into the
stacked ``[n, min, max]`` input of one batched NS call (tall matrices transposed), each
compiled alone and timed on one thread (medians):

- ``per matrix, reshape``: each matrix a reshape of its strided ``[W, slot]`` block;
- ``per matrix, by shards``: each matrix the concatenation of its W shards;
- ``by layout``: what ``passes/distribute.py`` does (``_received_groups``): each layout's
  members one ``[W, n, rows_per_shard, cols]`` block, permuted and reshaped.

Under ``all_to_all`` the owner then cuts the stacked results back into the flat buffer
that returns every rank its rows (``cut back``), two spellings:

- ``per matrix``: each result (transposed back if tall) zero-padded by a concatenation
  and viewed as ``[W, slot]``, the members concatenated along the slots;
- ``by layout``: what ``passes/distribute.py`` does (``_scatter_rows``): each layout's
  results one block, padded, permuted to ``[W, n, rows_per_shard, cols]``.

Shapes: ``gpt-small``'s six 1536x384 (tall) and six 384x1536 (wide) matrices of one
layer group, and all its matrices in one bucket (``mixed``: several layouts, as a step's
buckets hold them), bf16. docs/benchmarks.md quotes the result.
"""

import argparse
import itertools

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from bench_distributed import WORKLOADS
from bench_symmetric_products import median_s

from muon_compile.config import Strategy
from muon_compile.passes.distribute import _received_groups, _scatter_rows
from muon_compile.plan import plan_for

SHAPES = {"tall 1536x384": [(1536, 384)] * 6, "wide 384x1536": [(384, 1536)] * 6, "mixed": WORKLOADS["gpt-small"]}


def per_matrix(grid: torch.Tensor, order, by_shards: bool) -> dict[int, torch.Tensor]:
    """Each member's canonical matrix (tall ones transposed), by site."""
    world, offset, mats = grid.size(0), 0, {}
    for m in order:
        block = grid[:, offset : offset + m.slot]
        if by_shards:
            whole = torch.cat([s.view(m.rows_per_shard, m.cols) for s in block.unbind(0)])
        else:
            whole = block.reshape(world * m.rows_per_shard, m.cols)
        mats[m.site] = whole[: m.rows].mT if m.rows > m.cols else whole[: m.rows]
        offset += m.slot
    return mats


def cut_per_matrix(groups, world: int) -> torch.Tensor:
    """The send buffer as ``_scatter_rows`` wrote it before 2026-11-25, the baseline: each
    result padded by a concatenation with zero rows and viewed as ``[W, slot]``."""
    blocks = []
    for members, stacked in groups:
        for m, y in zip(members, stacked.unbind(0)):
            y = y.mT if m.rows > m.cols else y
            padded = torch.cat([y, y.new_zeros(world * m.rows_per_shard - m.rows + 1, m.cols)])[: world * m.rows_per_shard]
            blocks.append(padded.view(world, m.slot))
    return torch.cat(blocks, dim=1).reshape(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, one thread, bf16, median of {args.reps}, ms")
    for world, (name, shapes) in itertools.product(args.world, SHAPES.items()):
        order = plan_for(shapes, world, Strategy.ALL_GATHER, bucket_mb=1024).buckets[0].owner_order()
        grid = torch.randn(world, sum(m.slot for m in order)).bfloat16()
        members = [ms for ms, _ in _received_groups(grid, order)]  # the NS groups

        def as_groups(mats: dict[int, torch.Tensor]) -> list[torch.Tensor]:
            return [torch.stack([mats[m.site] for m in ms]) for ms in members]

        spellings = {
            "per matrix, reshape": lambda g: as_groups(per_matrix(g, order, by_shards=False)),
            "per matrix, by shards": lambda g: as_groups(per_matrix(g, order, by_shards=True)),
            "by layout": lambda g: [s.contiguous() for _, s in _received_groups(g, order)],  # as stack's results are
        }
        # traced first, as the pass traces its stages (Dynamo does not trace itertools.groupby)
        compiled = {k: torch.compile(make_fx(fn)(grid), fullgraph=True) for k, fn in spellings.items()}
        stacks = spellings["by layout"](grid)
        for k, fn in compiled.items():
            assert all(torch.equal(a, b) for a, b in zip(fn(grid), stacks, strict=True)), k
        cells = ", ".join(f"{k} {median_s(lambda: fn(grid), args.reps) * 1e3:.2f}" for k, fn in compiled.items())
        print(f"world {world}, {name}: {cells}", flush=True)
        cuts = {
            "per matrix": lambda *ys: cut_per_matrix(list(zip(members, ys)), world),
            "by layout": lambda *ys: _scatter_rows(list(zip(members, ys)), world),
        }
        compiled = {k: torch.compile(make_fx(fn)(*stacks), fullgraph=True) for k, fn in cuts.items()}
        want = cuts["by layout"](*stacks)
        for k, fn in compiled.items():
            assert torch.equal(fn(*stacks), want), k
        cells = ", ".join(f"{k} {median_s(lambda: fn(*stacks), args.reps) * 1e3:.2f}" for k, fn in compiled.items())
        print(f"world {world}, {name}, cut back: {cells}", flush=True)


if __name__ == "__main__":
    main()

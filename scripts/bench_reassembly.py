"""How fast does Inductor's code reassemble received shards into the matrices NS stacks?

    python scripts/bench_reassembly.py [--world 2 3] [--reps 15]

A distributed bucket's compute stage receives a ``[W, elements]`` grid: each rank's
padded row shards of the matrices, side by side. Three spellings of turning it into the
stacked ``[n, min, max]`` input of one batched NS call (tall matrices transposed), each
compiled alone and timed on one thread (medians):

- ``per matrix, reshape``: each matrix a reshape of its strided ``[W, slot]`` block;
- ``per matrix, by shards``: each matrix the concatenation of its W shards;
- ``by layout``: what ``passes/distribute.py`` does (``_received_groups``): each layout's
  members one ``[W, n, rows_per_shard, cols]`` block, permuted and reshaped.

Shapes: ``gpt-small``'s six 1536x384 (tall) and six 384x1536 (wide) matrices of one
layer group, bf16. docs/benchmarks.md quotes the result.
"""

import argparse
import itertools

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from bench_symmetric_products import median_s

from muon_compile.config import Strategy
from muon_compile.passes.distribute import _received_groups
from muon_compile.plan import plan_for

SHAPES = {"tall 1536x384": [(1536, 384)] * 6, "wide 384x1536": [(384, 1536)] * 6}


def per_matrix(grid: torch.Tensor, order, by_shards: bool) -> torch.Tensor:
    world, offset, mats = grid.size(0), 0, []
    for m in order:
        block = grid[:, offset : offset + m.slot]
        if by_shards:
            whole = torch.cat([s.view(m.rows_per_shard, m.cols) for s in block.unbind(0)])
        else:
            whole = block.reshape(world * m.rows_per_shard, m.cols)
        mats.append(whole[: m.rows].mT if m.rows > m.cols else whole[: m.rows])
        offset += m.slot
    return torch.stack(mats)


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
        spellings = {
            "per matrix, reshape": lambda g: per_matrix(g, order, by_shards=False),
            "per matrix, by shards": lambda g: per_matrix(g, order, by_shards=True),
            "by layout": lambda g: _received_groups(g, order)[0][1].contiguous(),  # as stack's result is
        }
        # traced first, as the pass traces its stages (Dynamo does not trace itertools.groupby)
        compiled = {k: torch.compile(make_fx(fn)(grid), fullgraph=True) for k, fn in spellings.items()}
        want = spellings["by layout"](grid)
        for k, fn in compiled.items():
            assert torch.equal(fn(grid), want), k
        cells = ", ".join(f"{k} {median_s(lambda: fn(grid), args.reps) * 1e3:.2f}" for k, fn in compiled.items())
        print(f"world {world}, {name}: {cells}", flush=True)


if __name__ == "__main__":
    main()

"""The Newton–Schulz products' rates by shape, against the cost model's cube rule.

    python scripts/bench_product_shapes.py [--workload gpt-small] [--reps 9]

The cost model prices an ``(m x k) @ (k x n)`` product from the profile's square
products of equal volume and, where the profile measured them, its non-square families
(:mod:`muon_compile.matmul_rates`). This script measures how far each rule holds on this
machine, one thread, one rank, bf16, side by side in one run:

1. the profile's tables, timed by ``scripts/measure_profiles.py``'s own functions
   (:func:`measure_profiles.square_rates`, :func:`measure_profiles.family_rates`);
2. the workload's Newton–Schulz compiled as the step lowers it
   (:func:`muon_compile.ns_kernel.orthogonalize` under ``torch.compile``), one call per
   stack of the workload's matrices of one shape (transposed to wide, as the step
   stacks them), 5 steps of the ``keller`` coefficients, the algorithm ``auto`` picks,
   profiled ``--reps`` times.

For each product shape of step 2 it prints the measured GFLOP/s, the rate each rule
reads from step 1's tables (:meth:`MatmulRates.rate`: by volume alone, the cube rule;
by volume and aspect) and the ratio of each to the measured one; then the whole
Newton–Schulz's product time against each rule's price of the same products. The price
is the products' arithmetic at the rule's rate: a product call's latency, which the
model prices apart (:meth:`MatmulRates.call_seconds`), is not in it, so the small
matrices of ``small-14`` are priced far below their time by either rule.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from bench_distributed import WORKLOADS

from measure_profiles import family_rates, rates_of, square_rates

from muon_compile.coefficients import ns_args
from muon_compile.matmul_rates import FAMILIES, cube_size
from muon_compile.ns_kernel import orthogonalize

DTYPE = torch.bfloat16


def stacks(shapes: list[tuple[int, int]]) -> list[torch.Tensor]:
    """One bf16 stack per wide shape of ``shapes`` (tall ones transposed), as many matrices as
    the workload has of it; single rows left out (the step scales them, no products)."""
    count = collections.Counter((min(r, c), max(r, c)) for r, c in shapes if min(r, c) > 1)
    return [torch.randn(n, r, c).to(DTYPE) for (r, c), n in sorted(count.items())]


def ns_products(batches: list[torch.Tensor], reps: int) -> dict[tuple[tuple[int, ...], ...], tuple[int, float]]:
    """Per ``bmm`` operand shapes of the compiled Newton–Schulz over ``batches``: calls per
    run and seconds per call (profiled self time)."""
    args = ns_args("keller", 5)
    compiled = torch.compile(orthogonalize, dynamic=False)

    def run() -> None:
        for x in batches:
            compiled(x, args)

    for _ in range(3):
        run()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(reps):
            run()
    found = {}
    for event in prof.key_averages(group_by_input_shape=True):
        if event.key == "aten::bmm":
            a, b = (tuple(s) for s in event.input_shapes[:2])
            found[a, b] = (event.count // reps, event.self_cpu_time_total / 1e6 / event.count)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=list(WORKLOADS), default="gpt-small")
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # the profile's timing barriers
    figures = {"matmul": square_rates(args.reps), "matmul_families": {f: family_rates(f, args.reps) for f in FAMILIES}}
    print(f"# torch {torch.__version__}, one thread, bf16, {args.workload}")
    by_aspect = rates_of(figures, "cpu", (DTYPE,), "measured in this run", log=lambda line: print(f"# {line}"))
    cube_rule = dataclasses.replace(by_aspect, families={})
    print(f"{'product':<32} {'calls':>5} {'ms/call':>8} {'GFLOP/s':>8} {'cube size':>9} {'cube rule':>9} {'ratio':>6} {'by aspect':>9} {'ratio':>6}")
    rules = (cube_rule, by_aspect)
    measured, priced = 0.0, [0.0, 0.0]
    for ((batch, m, k), (_, _, n)), (calls, seconds) in sorted(ns_products(stacks(WORKLOADS[args.workload]), args.reps).items()):
        flops = 2 * batch * m * k * n
        measured += calls * seconds
        columns = []
        for i, rates in enumerate(rules):
            priced[i] += calls * rates.seconds(DTYPE, m, k, n, batch)
            rate = rates.rate(DTYPE, m, k, n)
            columns.append(f"{rate:>9.1f} {rate * seconds * 1e9 / flops:>6.2f}")
        print(f"{f'[{batch}, {m}, {k}] @ [{batch}, {k}, {n}]':<32} {calls:>5} {seconds * 1e3:>8.3f} {flops / seconds / 1e9:>8.1f} "
              f"{cube_size(m, k, n):>9.0f} {' '.join(columns)}")
    cube, aspect = (p * 1e3 for p in priced)
    print(f"Newton–Schulz products per run: measured {measured * 1e3:.2f} ms; cube rule {cube:.2f} ms, ratio {measured * 1e3 / cube:.2f}; "
          f"by aspect {aspect:.2f} ms, ratio {measured * 1e3 / aspect:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

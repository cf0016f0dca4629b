"""The textbook Newton–Schulz iteration in two forms on one device (issue 75), median times
(muon_compile/ns/evaluate.py, ``orthogonalize``):

- ``--compare epilogue`` (default): the polynomial's scalars in the products' epilogues
  (``baddbmm``) against one pointwise kernel between plain products, on stacks of ``m x 4m``
  matrices (a wide matrix's bucket);
- ``--compare orientation``: tall ``4m x m`` matrices iterated in their own layout (``native``)
  against transposed in and back (``transposed``), the scalars where the device's table puts them.

    python scripts/bench_epilogue.py [--compare epilogue|orientation] [--device cpu] [--sizes 128,...] [--dtypes bf16,fp32] [--batch N] [--reps 20] [--json FILE]

For each size ``m`` and dtype: a stack (``--batch``, by default as many matrices as make 2²²
elements on a CPU, 2²⁶ on a GPU, at least one) orthogonalised by 5 iterations of Keller
Jordan's coefficients, each form compiled with Inductor (as the ``lower`` pass traces it), the
two timed in alternation. Columns: both times, their ratio, and the largest difference between
the two results in units of the result's largest entry. Last, the table the choice reads
(``MatmulRates.epilogue``: ``(m, polynomial time / epilogue time)``; ``MatmulRates.orientation``:
``(m, transposed time / native time)``) per dtype, ready to paste into
``muon_compile/ns/matmul_rates.py``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (  # noqa: E402
    clock_for,
    kernel_bench_parser,
    machine_info,
    machine_line,
    markdown_row,
    markdown_rule,
    positive_int,
    python_table,
)

from muon_compile.ns import coefficients  # noqa: E402
from muon_compile.ns.cost import EPILOGUE, NATIVE, POLYNOMIAL, TRANSPOSED  # noqa: E402
from muon_compile.ns.evaluate import orthogonalize  # noqa: E402

ASPECT = 4  # the long side of each matrix over its short one
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# per comparison: orthogonalize's keyword, its two forms (the ratio is the second's time over the
# first's: above 1, the first is faster), whether the matrices are tall
COMPARISONS = {"epilogue": ("epilogue", (EPILOGUE, POLYNOMIAL), False), "orientation": ("orientation", (NATIVE, TRANSPOSED), True)}


def default_batch(m: int, device: torch.device) -> int:
    elements = 2**22 if device.type == "cpu" else 2**26
    return max(1, elements // (ASPECT * m * m))


def measure(
    m: int, dtype: str, device: torch.device, warmup: int, reps: int, batch: int | None = None, compare: str = "epilogue"
) -> dict:
    keyword, forms, tall = COMPARISONS[compare]
    batch = batch or default_batch(m, device)
    g = torch.Generator().manual_seed(m)
    shape = (batch, ASPECT * m, m) if tall else (batch, m, ASPECT * m)
    x = torch.randn(shape, generator=g).to(device)
    args = coefficients.ns_args("keller", 5, compute_dtype=DTYPES[dtype], algorithm="textbook")
    torch._dynamo.reset()  # each size and form a compile of its own, none past the recompile limit
    steps = {f: torch.compile(lambda t, f=f: orthogonalize(t, args, **{keyword: f}), dynamic=False) for f in forms}
    clock = clock_for(device)
    for form in forms:
        for _ in range(warmup):
            steps[form](x)
    clock.synchronize()
    times: dict[str, list[float]] = {form: [] for form in forms}
    for _ in range(reps):
        for form in forms:
            times[form].append(clock.step_s(lambda form=form: steps[form](x)))
    row = {"m": m, "dtype": dtype, "shape": "x".join(map(str, shape[1:])), "batch": batch}
    for form in forms:
        row[f"{form}_ms"] = statistics.median(times[form]) * 1e3
    reference = steps[forms[0]](x).float()
    diff = (steps[forms[1]](x).float() - reference).abs().max()
    row["max_diff"] = float(diff / reference.abs().max().clamp_min(1e-30))
    row["ratio"] = row[f"{forms[1]}_ms"] / row[f"{forms[0]}_ms"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = kernel_bench_parser(__doc__)
    parser.add_argument("--sizes", default="64,128,256,384,512,1024,2048")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--batch", type=positive_int, help="matrices per stack (default: see above)")
    parser.add_argument("--compare", choices=list(COMPARISONS), default="epilogue")
    args = parser.parse_args(argv)
    _, forms, _ = COMPARISONS[args.compare]
    device = torch.device(args.device)
    sizes = [int(s) for s in args.sizes.split(",")]
    machine = machine_info(device)
    print(machine_line(machine))
    print(f"textbook NS, 5 iterations, each form compiled; medians of {args.reps} after {args.warmup}, alternating")
    print()
    print(markdown_row(["dtype", "matrix", "batch", f"{forms[0]} ms", f"{forms[1]} ms", f"{forms[1]} / {forms[0]}", "max diff"]))
    print(markdown_rule("llrrrrr"))
    rows = []
    for dtype in args.dtypes.split(","):
        for m in sizes:
            row = measure(m, dtype, device, args.warmup, args.reps, args.batch, args.compare)
            rows.append(row)
            print(markdown_row([
                dtype, row["shape"], str(row["batch"]), f"{row[f'{forms[0]}_ms']:.3f}", f"{row[f'{forms[1]}_ms']:.3f}",
                f"{row['ratio']:.2f}", f"{row['max_diff']:.1e}",
            ]), flush=True)
    table = ratio_table(rows)
    print()
    print(f"MatmulRates.{args.compare} of this device: {table}")
    if args.json:
        args.json.write_text(json.dumps({"compare": args.compare, "machine": machine, "rows": rows, "table": table}, indent=1))
    return 0


def ratio_table(rows: list[dict]) -> str:
    """Per dtype, ``(m, the ratio of the two forms' times)``, as Python for ``muon_compile/ns/matmul_rates.py``."""
    by_m = sorted(rows, key=lambda r: r["m"])
    names = {"bf16": "torch.bfloat16", "fp32": "torch.float32"}
    return python_table({name: [(r["m"], r["ratio"]) for r in by_m if r["dtype"] == dtype] for dtype, name in names.items()})


if __name__ == "__main__":
    sys.exit(main())

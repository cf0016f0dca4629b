"""Symmetric products against ``bmm`` on one device (issue 62): for each size ``m``, the op
``muon_compile::sym_bmm`` (muon_compile/kernels/sym.py: only the tiles on and above the
diagonal) and ``torch.bmm`` on the same operands, one after the other, median times.

    python scripts/bench_sym.py [--device cuda] [--sizes 256,...] [--dtypes bf16,fp16] [--batch N] [--reps 20] [--json FILE]

Two products per size, as Newton–Schulz forms them: ``gram``, ``X Xᵀ`` with ``X`` ``m x 4m``
(a wide matrix's Gram matrix), and ``square``, ``S S`` with ``S`` a symmetric ``m x m``;
bf16 (the textbook iteration's) and fp16 (the Gram iteration's), a batch of
``max(1, (4096 / m)²)`` matrices (a bucket's stack). Columns: both times,
their ratio, the rate of each in ``bmm``'s FLOPs (``2 B m² k``: the symmetric kernel computes
about half of them, so its rate there is an effective one, comparable with ``bmm``'s), and
the largest difference between the two results in units of the result's largest entry.
Last, the table ``ns_cost.choose_products`` reads (``MatmulRates.symmetric``), per dtype
``(m, bmm time / sym time)`` of one ``gram`` and one ``square`` product together, ready to
paste into ``muon_compile/ns/matmul_rates.py``. Off CUDA the op is ``bmm`` itself (the output
says so): ``--device cpu`` checks the script, not the kernel.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (  # noqa: E402
    clock_for, kernel_bench_parser, machine_info, machine_line, markdown_row, markdown_rule, positive_int, python_table,
    time_steps,
)

from muon_compile.kernels import sym as sym_kernel  # noqa: E402

ASPECT = 4  # the inner dimension of the gram product, in multiples of m


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def operands(kind: str, m: int, batch: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(m)
    if kind == "gram":
        x = torch.randn(batch, m, ASPECT * m, device=device, generator=g, dtype=dtype)
        return x, x.mT
    s = torch.randn(batch, m, m, device=device, generator=g, dtype=dtype)
    s = s + s.mT
    return s, s


def measure(kind: str, m: int, dtype: str, device: torch.device, warmup: int, reps: int, batch: int | None = None) -> dict:
    batch = batch or max(1, (4096 // m) ** 2)
    a, b = operands(kind, m, batch, DTYPES[dtype], device)
    clock = clock_for(device)
    flops = 2 * batch * m * m * a.shape[-1]
    row = {"kind": kind, "m": m, "dtype": dtype, "k": a.shape[-1], "batch": batch}
    for name, fn in (("bmm", torch.bmm), ("sym", sym_kernel.sym_bmm)):
        seconds = statistics.median(time_steps(lambda: fn(a, b), warmup, reps, clock))
        row[f"{name}_ms"] = seconds * 1e3
        row[f"{name}_tflops"] = flops / seconds / 1e12
    reference = torch.bmm(a, b).float()
    diff = (sym_kernel.sym_bmm(a, b).float() - reference).abs().max()
    row["max_diff"] = float(diff / reference.abs().max().clamp_min(1e-30))
    row["ratio"] = row["sym_ms"] / row["bmm_ms"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = kernel_bench_parser(__doc__)
    parser.add_argument("--sizes", default="256,512,1024,2048,4096,8192")
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--batch", type=positive_int, help="matrices per product (default: (4096 / m)², at least 1)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    sizes = [int(s) for s in args.sizes.split(",")]
    machine = machine_info(device)
    kernel = "the Triton kernel" if sym_kernel.triton_usable(device) else "torch.bmm (no Triton kernel on this device)"
    print(machine_line(machine))
    print(f"sym_bmm runs {kernel}; medians of {args.reps} after {args.warmup}")
    print()
    print(markdown_row(["product", "dtype", "m x k", "batch", "bmm ms", "sym ms", "sym / bmm", "bmm TFLOP/s", "sym TFLOP/s (bmm's FLOPs)", "max diff"]))
    print(markdown_rule("lllrrrrrrr"))
    rows = []
    for dtype in args.dtypes.split(","):
        for m in sizes:
            for kind in ("gram", "square"):
                try:
                    row = measure(kind, m, dtype, device, args.warmup, args.reps, args.batch)
                except torch.OutOfMemoryError:
                    print(markdown_row([kind, dtype, f"{m}", "-", "out of memory", "", "", "", "", ""]))
                    continue
                rows.append(row)
                print(markdown_row([
                    kind, dtype, f"{m} x {row['k']}", str(row["batch"]), f"{row['bmm_ms']:.3f}", f"{row['sym_ms']:.3f}",
                    f"{row['ratio']:.2f}", f"{row['bmm_tflops']:.1f}", f"{row['sym_tflops']:.1f}", f"{row['max_diff']:.1e}",
                ]), flush=True)
    table = speedup_table(rows)
    print()
    print(f"MatmulRates.symmetric of this device: {table}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "kernel": kernel, "rows": rows, "table": table}, indent=1))
    return 0


def speedup_table(rows: list[dict]) -> str:
    """Per dtype, ``(m, bmm time / sym time)`` of a gram and a square product together, as
    Python for ``muon_compile/ns/matmul_rates.py`` (sizes where both were measured)."""
    points = {}
    for dtype, name in (("bf16", "torch.bfloat16"), ("fp16", "torch.float16")):
        by_m: dict[int, dict[str, dict]] = {}
        for r in rows:
            if r["dtype"] == dtype:
                by_m.setdefault(r["m"], {})[r["kind"]] = r
        points[name] = [
            (m, sum(r["bmm_ms"] for r in kinds.values()) / sum(r["sym_ms"] for r in kinds.values()))
            for m, kinds in sorted(by_m.items()) if len(kinds) == 2
        ]
    return python_table(points)


if __name__ == "__main__":
    sys.exit(main())

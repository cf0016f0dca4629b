"""The stacks' write on one device (issue 59): ``muon_compile::unstack_scale_add_`` (one
Triton launch where Triton runs, muon_compile/kernels/scale_add.py) against the write it
replaced, on the stacks of Llama 3.2 1B and of 4 Llama 3.1 8B layers, one after the other, medians.

    python scripts/bench_write.py [--device cuda] [--stacks 32x2048x2048,...] [--reps 20] [--json FILE]

A stack ``BxMxN`` is ``B`` fp32 parameters of ``M x N`` and the bf16 Newton–Schulz result
``[B, M, N]``, transposed (a view of ``[B, N, M]``) for a tall matrix (``M > N``), as the
compiled step hands it over; weight decay on (``scale`` 0.999), ``scale`` and ``alpha`` 0-D
float64 CPU tensors, as in a compiled step. Arms:

* ``write``: the op (one pass: the result read, each parameter read and written);
* ``before``: what a step did before it: an fp32 ``alpha * O`` written (the generated
  kernel's), ``torch._foreach_mul_`` and ``torch._foreach_add_`` over the parameters.

Columns: both times, their ratio, each one's rate in the write's least bytes (2 + 4 + 4
bytes an entry, whatever the arm moves) per second, and the largest difference between the
two arms' parameters in units of their largest entry (an ulp or so: ``write`` adds
``alpha * O`` with one rounding, ``before`` with two). Off CUDA the op runs its ``torch``
fallback (the output says so): ``--device cpu`` checks the script, not the kernel.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import clock_for, kernel_bench_parser, machine_info, machine_line, markdown_row, markdown_rule, time_steps  # noqa: E402

from muon_compile import models  # noqa: E402
from muon_compile.kernels import scale_add as scale_add_kernel  # noqa: E402
from muon_compile.optim import stacks  # noqa: E402

# the stacks of Llama 3.2 1B and of 4 layers of Llama 3.1 8B (muon_compile/models.py)
STACKS = ",".join(f"{n}x{r}x{c}" for name in ("llama-1b", "llama-8b-4l") for n, r, c in models.stacks(name))
BYTES_PER_ENTRY = 2 + 4 + 4  # the bf16 result read, the fp32 parameter read and written
SCALE, ALPHA = 0.999, -0.02 * 1.4142


def parse_stack(text: str) -> tuple[int, int, int]:
    members, rows, cols = (int(part) for part in text.lower().split("x"))
    return members, rows, cols


def operands(members: int, rows: int, cols: int, device: torch.device) -> tuple[list[torch.Tensor], torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(members * rows + cols)
    params = [torch.randn(rows, cols, device=device, generator=g) for _ in range(members)]
    if rows > cols:  # a tall matrix's result, computed on its transpose
        result = torch.randn(members, cols, rows, device=device, generator=g).to(torch.bfloat16).mT
    else:
        result = torch.randn(members, rows, cols, device=device, generator=g).to(torch.bfloat16)
    return params, result


def write_before(params: list[torch.Tensor], scale: torch.Tensor, result: torch.Tensor, alpha: torch.Tensor) -> None:
    """The write before the kernel: the update scaled into fp32, then two foreach passes."""
    step = result.to(params[0].dtype) * alpha
    torch._foreach_mul_(params, scale.item())
    torch._foreach_add_(params, list(step.unbind(0)))


def measure(stack: str, device: torch.device, warmup: int, reps: int) -> dict:
    members, rows, cols = parse_stack(stack)
    params, result = operands(members, rows, cols, device)
    scale, alpha = torch.tensor(SCALE, dtype=torch.float64), torch.tensor(ALPHA, dtype=torch.float64)
    clock = clock_for(device)
    entries = members * rows * cols
    row = {"stack": stack, "transposed": rows > cols, "entries": entries}
    arms = {
        "write": lambda ps: stacks.unstack_scale_add_(ps, scale, result, alpha),
        "before": lambda ps: write_before(ps, scale, result, alpha),
    }
    finals = {}
    for name, fn in arms.items():
        ps = [p.clone() for p in params]
        fn(ps)
        finals[name] = [p.clone() for p in ps]  # one step from the same start, for the difference
        seconds = statistics.median(time_steps(lambda: fn(ps), warmup, reps, clock))
        row[f"{name}_ms"] = seconds * 1e3
        row[f"{name}_gbps"] = BYTES_PER_ENTRY * entries / seconds / 1e9
    largest = max(p.abs().max() for p in finals["before"]).clamp_min(1e-30)
    row["max_diff"] = float(max((a - b).abs().max() for a, b in zip(finals["write"], finals["before"])) / largest)
    row["ratio"] = row["write_ms"] / row["before_ms"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = kernel_bench_parser(__doc__)
    parser.add_argument("--stacks", default=STACKS, help="comma list of BxMxN (members x rows x cols)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    machine = machine_info(device)
    kernel = "the Triton kernel" if scale_add_kernel.triton_usable(device) else "its torch fallback (no Triton kernel on this device)"
    print(machine_line(machine))
    print(f"unstack_scale_add_ runs {kernel}; fp32 parameters, bf16 result; medians of {args.reps} after {args.warmup}")
    print()
    print(markdown_row(["stack", "result", "write ms", "before ms", "write / before", "write GB/s", "before GB/s", "max diff"]))
    print(markdown_rule("llrrrrrr"))
    rows = []
    for stack in args.stacks.split(","):
        try:
            row = measure(stack, device, args.warmup, args.reps)
        except torch.OutOfMemoryError:
            print(markdown_row([stack, "-", "out of memory", "", "", "", "", ""]))
            continue
        rows.append(row)
        print(markdown_row([
            stack, "transposed" if row["transposed"] else "as is", f"{row['write_ms']:.3f}", f"{row['before_ms']:.3f}",
            f"{row['ratio']:.2f}", f"{row['write_gbps']:.0f}", f"{row['before_gbps']:.0f}", f"{row['max_diff']:.1e}",
        ]), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "kernel": kernel, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

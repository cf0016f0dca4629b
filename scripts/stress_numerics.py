"""Measure how far the compiled Muon step strays from eager, over many random updates.

    python scripts/stress_numerics.py [--steps 30] [--rewrites]

For each NS dtype (fp32, bf16) and preset (keller, polar_express) it runs the test
suite's mixed shapes (tests/support/helpers.py: tall, wide, square, odd, a 3-D stack) for
``--steps`` steps eager and with backend="muon" from the same state, and prints the
distribution of the relative error of each parameter's update.

``--rewrites`` measures the canonicalize pass instead: each hand-written Newton–Schulz
form of tests/support/ns_forms.py in bf16 on the same shapes, ``--steps`` random inputs each,
compiled and eager, against the exact (fp64) evaluation of the same code. It prints the
distribution of ``err(compiled, exact) / err(eager, exact)`` and the largest
``err(compiled, exact) / max(5e-2, REWRITE_MARGIN * err(eager, exact))`` (the test bound, with REWRITE_MARGIN from tests/support/numerics.py; must stay < 1).
The tolerances in tests/support/numerics.py quote these figures.

``--algorithms`` measures the Newton–Schulz evaluations of muon_compile.ns.evaluate
instead: for each preset (keller, polar_express, quintic, aol), compute dtype (bf16,
fp32), Newton–Schulz steps (5, 10), shape (wide, square, wider) and input class
(random; condition numbers 1e2, 1e4, 1e6 with log-spaced singular values; rank 4; near
zero, entries ~1e-30), ``--samples`` inputs each, the error of ``muon_compile.newton_schulz(x, algorithm=a)`` against the fp64
textbook iteration of the same coefficients. It prints, per row, the largest
``err(gram) / err(textbook)`` over the samples (the bound of issue 14: must stay <= 1
wherever ``auto`` may pick Gram; muon_compile.ns.cost.GRAM_DTYPES quotes the result).

``--products`` measures the symmetric products (muon_compile.kernels.sym) instead: for the
same presets, steps, shapes and inputs in bf16, the largest ``err(sym) / err(bmm)`` over the
samples for each algorithm (textbook, and Gram in fp16), each against the fp64 textbook
iteration. On a CPU it needs Triton's interpreter (``TRITON_INTERPRET=1``), through which
the op runs the kernel there; elsewhere the op would be ``bmm`` and every ratio 1.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

import muon_compile  # noqa: E402
from helpers import MIXED_SHAPES, make_params, set_grads  # noqa: E402
from numerics import rel_err  # noqa: E402


def update_errors(ns_dtype: torch.dtype, preset: str, steps: int) -> list[float]:
    """Relative error of every parameter update, the compiled step restarted from eager's state each step."""
    eager_params, comp_params = make_params(MIXED_SHAPES), make_params(MIXED_SHAPES)
    eager = muon_compile.Muon(eager_params, lr=0.05, ns_dtype=ns_dtype, ns_coefficients=preset)
    comp = muon_compile.Muon(comp_params, lr=0.05, ns_dtype=ns_dtype, ns_coefficients=preset)
    compiled_step = torch.compile(comp.step, backend="muon")
    errors = []
    for seed in range(steps):
        set_grads(eager_params, seed)
        set_grads(comp_params, seed)
        before = [p.detach().clone() for p in eager_params]
        eager.step()
        compiled_step()
        errors += [rel_err(c.detach() - b, e.detach() - b) for e, c, b in zip(eager_params, comp_params, before)]
        with torch.no_grad():
            for e, c in zip(eager_params, comp_params):
                c.copy_(e)
                comp.state[c]["momentum_buffer"].copy_(eager.state[e]["momentum_buffer"])
    return sorted(errors)


def rewrite_ratios(form: str, samples: int) -> tuple[list[float], float]:
    """``err(compiled, exact) / err(eager, exact)`` of every result, and the largest share of the test bound."""
    from ns_forms import FORMS
    from numerics import NS_RTOL, REWRITE_MARGIN

    fn = FORMS[form]

    def many(Gs, dtype):
        return [fn(G, dtype=dtype) for G in Gs]

    torch._dynamo.reset()
    compiled = torch.compile(many, backend="muon")
    ratios, worst = [], 0.0
    for seed in range(samples):
        g = torch.Generator().manual_seed(seed)
        inputs = [torch.randn(s, generator=g) for s in MIXED_SHAPES]
        got, eager = compiled(inputs, torch.bfloat16), many(inputs, torch.bfloat16)
        exact = many([x.double() for x in inputs], torch.float64)
        for c, e, x in zip(got, eager, exact):
            ours, theirs = rel_err(c, x), rel_err(e, x)
            ratios.append(ours / theirs)
            worst = max(worst, ours / max(NS_RTOL["cpu"][torch.bfloat16], REWRITE_MARGIN * theirs))
    return sorted(ratios), worst


ALGORITHM_SHAPES = ((64, 256), (96, 96), (128, 384))
INPUT_CLASSES = ("random", "cond1e2", "cond1e4", "cond1e6", "rank4", "near-zero")


def stress_input(kind: str, rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """One fp64 input of ``kind`` (see ``--algorithms``)."""
    if kind == "random":
        return torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    if kind == "near-zero":
        return 1e-30 * torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    k = min(rows, cols)
    u, _ = torch.linalg.qr(torch.randn(rows, k, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, k, generator=gen, dtype=torch.float64))
    if kind == "rank4":
        sigma = torch.zeros(k, dtype=torch.float64)
        sigma[:4] = 0.5 + torch.rand(4, generator=gen, dtype=torch.float64)
    else:
        sigma = torch.logspace(0, -float(kind[len("cond1e"):]), k, dtype=torch.float64)
    return (u * sigma) @ v.mT


def algorithm_ratios(
    preset: str, dtype: torch.dtype, steps: int, shape: tuple[int, int], kind: str, samples: int
) -> tuple[float, float, float]:
    """Largest ``err(gram) / err(textbook)`` over ``samples`` inputs, and the largest of each error."""
    worst, e_text, e_gram = 0.0, 0.0, 0.0
    for seed in range(samples):
        x = stress_input(kind, *shape, torch.Generator().manual_seed(seed))
        exact = muon_compile.newton_schulz(x, preset, steps, compute_dtype=torch.float64, algorithm="textbook")
        text = rel_err(muon_compile.newton_schulz(x, preset, steps, compute_dtype=dtype, algorithm="textbook"), exact)
        gram = rel_err(muon_compile.newton_schulz(x, preset, steps, compute_dtype=dtype, algorithm="gram"), exact)
        worst = max(worst, _ratio(gram, text))
        e_text, e_gram = max(e_text, _nan_high(text)), max(e_gram, _nan_high(gram))
    return worst, e_text, e_gram


def _nan_high(x: float) -> float:
    """``x``, or inf for NaN: ``max`` keeps its first argument against a NaN, which hid the
    NaN results of the Gram iteration near zero in this table until 2026-11-29."""
    return float("inf") if x != x else x


def _ratio(ours: float, theirs: float) -> float:
    """``ours / theirs`` for the tables' maxima: 0 when both are 0, inf when only ours is or
    either is NaN."""
    if ours != ours or theirs != theirs:
        return float("inf")
    return ours / theirs if theirs > 0 else (0.0 if ours == 0 else float("inf"))


def products_ratios(preset: str, steps: int, shape: tuple[int, int], kind: str, samples: int) -> dict[str, float]:
    """Per algorithm, the largest ``err(sym) / err(bmm)`` of bf16 evaluations over ``samples`` inputs."""
    from muon_compile.ns.coefficients import ns_args
    from muon_compile.ns.cost import BMM, SYMMETRIC
    from muon_compile.ns.evaluate import orthogonalize

    worst = {"textbook": 0.0, "gram": 0.0}
    for seed in range(samples):
        x = stress_input(kind, *shape, torch.Generator().manual_seed(seed))
        exact = muon_compile.newton_schulz(x, preset, steps, compute_dtype=torch.float64, algorithm="textbook")
        for algorithm in worst:
            args = ns_args(preset, steps, compute_dtype=torch.bfloat16, algorithm=algorithm)
            sym = rel_err(orthogonalize(x.float(), args, algorithm, products=SYMMETRIC), exact)
            plain = rel_err(orthogonalize(x.float(), args, algorithm, products=BMM), exact)
            worst[algorithm] = max(worst[algorithm], _ratio(sym, plain))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rewrites", action="store_true", help="measure the canonicalize pass's rewrites")
    parser.add_argument("--algorithms", action="store_true", help="measure Gram against textbook Newton-Schulz")
    parser.add_argument("--samples", type=int, default=3, help="inputs per row of --algorithms and --products")
    parser.add_argument("--products", action="store_true", help="measure symmetric products against bmm")
    args = parser.parse_args()
    if args.products:
        from muon_compile.kernels import sym as sym_kernel

        if not sym_kernel.triton_usable(torch.device("cpu")):
            parser.error("--products on the CPU runs the kernel through Triton's interpreter: set TRITON_INTERPRET=1")
        print("preset          steps shape     input      max err(sym)/err(bmm) textbook  gram (fp16)")
        for preset in ("keller", "polar_express", "quintic", "aol"):
            for steps in (5, 10):
                for shape in ALGORITHM_SHAPES:
                    for kind in INPUT_CLASSES:
                        worst = products_ratios(preset, steps, shape, kind, args.samples)
                        print(
                            f"{preset:15} {steps:5} {shape[0]}x{shape[1]:<6} {kind:10} "
                            f"{worst['textbook']:35.3f}  {worst['gram']:11.3f}",
                            flush=True,
                        )
        return
    if args.algorithms:
        print("preset          dtype     steps shape     input      max err(gram)/err(textbook)  max err textbook  max err gram")
        for preset in ("keller", "polar_express", "quintic", "aol"):
            for dtype in (torch.bfloat16, torch.float32):
                for steps in (5, 10):
                    for shape in ALGORITHM_SHAPES:
                        for kind in INPUT_CLASSES:
                            ratio, text, gram = algorithm_ratios(preset, dtype, steps, shape, kind, args.samples)
                            print(
                                f"{preset:15} {str(dtype)[6:]:9} {steps:5} {shape[0]}x{shape[1]:<6} {kind:10} "
                                f"{ratio:27.3f}  {text:16.3g}  {gram:12.3g}",
                                flush=True,
                            )
        return
    if args.rewrites:
        from ns_forms import FORMS

        for form in FORMS:
            ratios, worst = rewrite_ratios(form, args.steps)
            print(
                f"{form:14} results {len(ratios)}  err(compiled)/err(eager) vs exact: median {ratios[len(ratios) // 2]:.2f}  "
                f"max {ratios[-1]:.2f}  largest share of the test bound {worst:.2f}"
            )
        return
    for ns_dtype in (torch.float32, torch.bfloat16):
        for preset in ("keller", "polar_express"):
            errs = update_errors(ns_dtype, preset, args.steps)
            exact = sum(e == 0 for e in errs)
            print(
                f"{str(ns_dtype):15} {preset:14} updates {len(errs)}  bitwise equal {exact}  "
                f"median {errs[len(errs) // 2]:.3g}  max {errs[-1]:.3g}"
            )


if __name__ == "__main__":
    main()

"""The corpus of public Muon implementations (tests/support/muon_corpus.py), benchmarked: for each
entry, one optimizer step of its own code run eagerly, compiled with Inductor (the
default backend) and compiled with ``backend="muon"``.

What is measured, per entry and arm (timing, matmul counting and cold compiles are
``scripts/bench_common.py``'s, as in ``scripts/bench_single_device.py``):

* the median of ``--reps`` timed steps after ``--warmup`` untimed ones;
* matmul kernel calls per step (``aten::mm/bmm/addmm/baddbmm`` profiler events): the
  per-matrix loop launches three per iteration per matrix, a bucketed one three per
  iteration per bucket;
* for the compiled arms, the first call in a fresh Inductor cache (compile and run);
* for ``muon``, whether every Newton–Schulz loop of the step became the op
  (``canonicalize.matched`` a multiple of the entry's loop count, nothing rejected, the step
  one graph), and the
  Newton–Schulz ops of a compile against the buckets they made (xN: N compiles ran the passes);
* the graphs one step runs (Dynamo's, without compiling: ``torch._dynamo.explain``): more
  than one means graph breaks split the step.

The eager arm runs under ``torch.compiler.set_stance("force_eager")``, so an entry whose
loop is a nested ``@torch.compile`` function runs it eagerly too. Every arm starts from the
same parameters and gradients (the entry's step keeps its state between steps; a step that
sets each ``p.grad`` to None, as HeavyBall's does, gets them back before the next).

``--entries released`` runs the Muon packages released on PyPI instead
(tests/support/released_packages.py: each optimizer built as its package documents it, its
``step``; the first warm-up step makes its state).

Usage::

    python scripts/bench_corpus.py                       # every entry, gpt-small-ish shapes
    python scripts/bench_corpus.py --entries keller_muon,nanochat --reps 5
    python scripts/bench_corpus.py --entries released    # the released packages
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

import muon_compile

from bench_common import (
    Arm, ArmResult, cell, machine_info, machine_line, markdown_row, markdown_rule, measure, non_negative_int, positive_int,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from muon_corpus import CORPUS, Entry  # noqa: E402  (the corpus lives with the tests)
from released_packages import RELEASED  # noqa: E402


def _released_entry(name: str) -> Entry:
    """The released package ``name`` as a corpus entry: its optimizer's ``step``."""
    package = RELEASED[name]
    return Entry(name, f"{name} from PyPI", "released package", lambda params, dtype: package.make(params).step,
                 package.dtype, stacks=package.stacks)


ENTRIES = {**CORPUS, **{name: _released_entry(name) for name in RELEASED}}

# 4 layers of a d=256 GPT: fused QKV, attention out, MLP up and down (4 shapes, 16 matrices)
SHAPES = tuple(s for _ in range(4) for s in ((768, 256), (256, 256), (1024, 256), (256, 1024)))
SEED = 0
ARM_NAMES = ("eager", "inductor", "muon")


def make_step(entry: Entry, device: torch.device, eager: bool):
    """``entry``'s step over fresh seeded parameters of ``SHAPES`` with fixed gradients (given
    back before a step to parameters whose gradient the last step set to None)."""
    gen = torch.Generator().manual_seed(SEED)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).to(device)) for s in SHAPES]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(device)
    grads = [p.grad for p in params]
    optimizer_step = entry.step(params)

    def step() -> None:
        # a step that sets each p.grad to None (HeavyBall's) finds the same gradients at the next
        for p, g in zip(params, grads):
            if p.grad is None:
                p.grad = g
        optimizer_step()

    if not eager:
        return step

    def eager_step() -> None:
        with torch.compiler.set_stance("force_eager"):
            step()

    return eager_step


@dataclasses.dataclass
class EntryResult:
    """One entry's arms, and what ``backend="muon"`` made of its step."""

    entry: Entry
    arms: list[ArmResult]
    recognised: bool
    graphs: int  # graphs one step runs
    ops_to_buckets: str  # "NS ops -> buckets" of the cold compile


def graphs_per_step(entry: Entry, device: torch.device) -> int:
    """The graphs Dynamo makes of one step of ``entry`` (graph breaks split a step)."""
    step = make_step(entry, device, eager=False)
    torch._dynamo.reset()
    with torch.no_grad():
        count = torch._dynamo.explain(step)().graph_count
    torch._dynamo.reset()
    return count


def bench_entry(entry: Entry, device: torch.device, warmup: int, reps: int) -> EntryResult:
    """The three arms' results and what ``backend="muon"`` made of the step."""
    results, recognised, buckets = [], False, ""
    for name in ARM_NAMES:
        arm = Arm(name, name, lambda e, d, eager=name == "eager": make_step(e, d, eager), None if name == "eager" else name)
        muon_compile.counters.clear()
        results.append(measure(arm, entry, device, warmup, reps))
        if name == "muon":  # measure compiles twice (cold, then warm), a step that makes its state a third time
            c, loops = muon_compile.counters, entry.loops(SHAPES)
            matched = c["canonicalize.matched"]
            recognised = matched > 0 and matched % loops == 0 and c["canonicalize.rejected"] == 0
            compiles = c["find.ns_ops"] // loops if c["find.ns_ops"] % loops == 0 and c["find.ns_ops"] else 1
            buckets = f"{c['find.ns_ops'] // compiles} -> {c['bucket.buckets'] // compiles}"
            buckets += f" (x{compiles})" if compiles > 1 else ""
    graphs = graphs_per_step(entry, device)  # a step split by graph breaks: its loops are not bucketed together
    return EntryResult(entry, results, recognised and graphs == 1, graphs, buckets)


def report(rows: list[EntryResult]) -> str:
    head = ["entry", "eager ms", "inductor ms", "muon ms", "muon / inductor", "matmuls eager / inductor / muon",
            "first call s inductor / muon", "graphs / step", "NS ops -> buckets", "recognised"]
    lines = [markdown_row(head), markdown_rule("lrrrrrrrrl")]
    for row in rows:
        entry, (eager, inductor, muon), recognised = row.entry, row.arms, row.recognised
        ms = [r.median_s * 1e3 if r.median_s is not None else None for r in (eager, inductor, muon)]
        ratio = ms[2] / ms[1] if None not in ms[1:] else None
        errors = "; ".join(f"{r.key}: {r.error}" for r in (eager, inductor, muon) if r.error)
        lines.append(markdown_row([
            entry.name, cell(ms[0], ".1f"), cell(ms[1], ".1f"), cell(ms[2], ".1f"), cell(ratio, ".2f"),
            " / ".join(cell(r.matmul_calls, "d") for r in (eager, inductor, muon)),
            f"{cell(inductor.cold_compile_s, '.1f')} / {cell(muon.cold_compile_s, '.1f')}",
            str(row.graphs), row.ops_to_buckets,
            ("yes" if recognised else "NO") + (f" ({errors})" if errors else ""),
        ]))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", default="all",
                        help="comma-separated corpus entry or released package names; all: the corpus (default); "
                        "released: the released packages")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=non_negative_int, default=2)
    parser.add_argument("--reps", type=positive_int, default=7)
    args = parser.parse_args()
    named = {"all": list(CORPUS), "released": list(RELEASED)}
    names = named.get(args.entries) or args.entries.split(",")
    unknown = [n for n in names if n not in ENTRIES]
    if unknown:
        parser.error(f"unknown entries {unknown}; known: {list(ENTRIES)}")
    device = torch.device(args.device)
    print(machine_line(machine_info(device)))
    print(f"shapes: {len(SHAPES)} matrices, {sorted(set(SHAPES))}; warmup {args.warmup}, reps {args.reps}")
    rows = []
    for name in names:
        rows.append(bench_entry(ENTRIES[name], device, args.warmup, args.reps))
        print(report(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(report(rows))


if __name__ == "__main__":
    main()

"""What ``muon_compile.compile_step`` costs (issue 76): the compiled step called as ``opt.step()``
against the bare compiled function, and a Hugging Face ``Trainer`` run's optimizer step eager
against compiled.

    python scripts/bench_compile_step.py [--device cpu] [--workloads tiny,many-small] [--reps 40]
        [--trainer-steps 12] [--json FILE]

1. Per workload (scripts/bench_single_device.py's): two ``muon_compile.Muon`` optimizers on the
   same values; one stepped by ``step = torch.compile(opt.step, backend="muon")``, ``step()``
   (``bare``), the other by ``compile_step(opt)`` with a ``LambdaLR`` built after it,
   ``opt.step()`` (``compile_step``: the step hooks, the profiler range and the scheduler's
   wrapper around the same compiled update). The two are called in alternation after a warm-up,
   medians; the ratio is the call's overhead.
2. A tiny Llama (4 layers of width 256, built from a config) trained ``--trainer-steps`` steps by
   ``transformers.Trainer`` with ``MuonAdamW`` under a cosine schedule, once eager and once after
   ``compile_step``: each ``optimizer.step()`` timed by the optimizer's step pre- and post-hooks
   (which run around the compiled step), medians of the steps after the first two (the compile).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import clock_for, machine_info, machine_line, markdown_row, markdown_rule, positive_int, time_steps  # noqa: E402
from bench_single_device import LR, WORKLOADS, make_params  # noqa: E402

import muon_compile  # noqa: E402


def overhead(workload, device, warmup: int, reps: int) -> dict:
    """Medians of the bare compiled function and of ``opt.step()`` after compile_step, alternated."""
    clock = clock_for(device)
    bare_opt = muon_compile.Muon(make_params(workload, device), lr=LR)
    bare = torch.compile(bare_opt.step, backend="muon")
    opt = muon_compile.compile_step(muon_compile.Muon(make_params(workload, device), lr=LR))
    torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)  # wraps opt.step, as a trainer's scheduler does
    time_steps(bare, warmup, 0, clock)
    time_steps(opt.step, warmup, 0, clock)
    times = {"bare": [], "compile_step": []}
    for _ in range(reps):
        times["bare"].append(clock.step_s(bare))
        times["compile_step"].append(clock.step_s(opt.step))
    medians = {arm: statistics.median(t) for arm, t in times.items()}
    return {"workload": workload.name, "matrices": len(workload.shapes), **{f"{a}_ms": m * 1e3 for a, m in medians.items()},
            "ratio": medians["compile_step"] / medians["bare"]}


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n, length, vocab):
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def trainer_steps_ms(compiled: bool, steps: int, device: torch.device) -> list[float]:
    """Each optimizer step's milliseconds in a Hugging Face Trainer run (step hooks' clock)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, get_cosine_schedule_with_warmup

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    model = LlamaForCausalLM(config).to(device)
    opt = muon_compile.MuonAdamW(muon_compile.muon_param_groups(model), lr=0.02, adamw_lr=3e-3)
    scheduler = get_cosine_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=steps)
    if compiled:
        muon_compile.compile_step(opt)
    clock = clock_for(device)
    times, started = [], []

    def before(*_) -> None:  # a pre-hook's return value would replace the step's arguments
        clock.synchronize()
        started.append(time.perf_counter())

    def after(*_) -> None:
        clock.synchronize()
        times.append((time.perf_counter() - started[-1]) * 1e3)

    opt.register_step_pre_hook(before)
    opt.register_step_post_hook(after)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=4, save_strategy="no",
                                 report_to="none", use_cpu=device.type == "cpu", disable_tqdm=True, logging_strategy="no")
        Trainer(model=model, args=args, train_dataset=_Tokens(4 * steps, 64, 512), optimizers=(opt, scheduler)).train()
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workloads", default="tiny,many-small")
    parser.add_argument("--warmup", type=positive_int, default=3)
    parser.add_argument("--reps", type=positive_int, default=40)
    parser.add_argument("--trainer-steps", type=positive_int, default=12)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    machine = machine_info(device)
    print(machine_line(machine))
    rows = [overhead(WORKLOADS[name], device, args.warmup, args.reps) for name in args.workloads.split(",")]
    print(f"\nopt.step() after compile_step (a LambdaLR built after) against the bare compiled function, alternated, "
          f"medians of {args.reps}:\n")
    print(markdown_row(["workload", "bare compiled ms", "compile_step ms", "compile_step / bare"]))
    print(markdown_rule("lrrr"))
    for r in rows:
        print(markdown_row([f"{r['workload']} ({r['matrices']} matrices)", f"{r['bare_ms']:.3f}", f"{r['compile_step_ms']:.3f}",
                            f"{r['ratio']:.3f}"]))
    trainer = {}
    for compiled in (False, True):
        ms = trainer_steps_ms(compiled, args.trainer_steps, device)
        trainer["compiled" if compiled else "eager"] = {"steps_ms": ms, "median_ms": statistics.median(ms[2:])}
    eager, compiled = trainer["eager"]["median_ms"], trainer["compiled"]["median_ms"]
    print(f"\nHugging Face Trainer, tiny Llama (4 layers, width 256), MuonAdamW, optimizer.step() median of steps "
          f"3-{args.trainer_steps}: eager {eager:.2f} ms, compile_step {compiled:.2f} ms ({eager / compiled:.2f}x faster); "
          f"first compiled step {trainer['compiled']['steps_ms'][0] / 1e3:.1f} s (the compile)")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "overhead": rows, "trainer": trainer}, indent=1))


if __name__ == "__main__":
    main()

"""Where the compile time of an optimizer step goes, as the number of matrices grows.

For each arm and each N (matrices of ``SHAPES``, cycling), two fresh processes share one
new Inductor cache directory: the first compiles cold, the second warm (the FX graph and
AOTAutograd caches filled by the first). Each process builds N fp32 parameters with
gradients, the optimizer, ``torch.compile(opt.step, backend=...)``, and reports:

* ``first call``: wall seconds of the first compiled step (compile and run);
* the phases inside the cold first call, from ``torch._dynamo.utils.compilation_time_metrics`` (the
  ``dynamo_timed`` regions of torch) and ``muon_compile.diagnostics.counters.pass_seconds``:

    dynamo        tracing the step's bytecode, guards (``_compile.compile_inner`` less the backend)
    canonicalize  muon_compile's torch-level pass (``backend="muon"`` only)
    aot           AOTAutograd: functionalisation and tracing to aten (``create_aot_dispatcher_function``
                  less ``compile_fx_inner``)
    post-grad     Inductor's post-grad passes, muon_compile's pipeline (``ours``) included
    ours          muon_compile's post-grad pipeline: find, plan, distribute, bucket, schedule, lower
    lowering      Inductor's lowering to its IR (``GraphLowering.run``)
    scheduling    Inductor's fusion and scheduling (``Scheduler.__init__``)
    codegen       kernel and wrapper code generation (``GraphLowering.codegen`` less scheduling),
                  including the waits for kernels compiled meanwhile
    load          loading the generated module (``compile_to_module`` less codegen): mostly
                  waiting for the last kernels' C++ / Triton compiles
    other         the first call less all of the above (running the step, cache lookups, guards...)

  and, as work rather than wall time, ``kernel files`` and ``compile cpu-s``: the C++ files
  Inductor compiled and the seconds their compiles took together (``compile_file``; they run
  on worker threads, overlapping each other and the phases above).

* ``graphs``: graphs Dynamo compiled for the step; ``step ms``: the median of ``--reps``
  steps after the first.

Arms: ``muon-ours`` (``muon_compile.Muon``, ``backend="muon"``), ``muon-torch``
(``torch.optim.Muon``, ``backend="muon"``), ``inductor-torch`` (``torch.optim.Muon``, the
default backend), ``inductor-ours`` (``muon_compile.Muon``, the default backend).
A process that runs past ``--timeout`` seconds is reported as such.

Usage::

    python scripts/bench_compile.py                              # N = 24, 96, 500, 2000; all arms
    python scripts/bench_compile.py --sizes 24,96 --arms muon-ours --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch

from bench_common import Clock, markdown_row, markdown_rule, positive_int, time_steps

SHAPES = ((64, 64), (64, 128), (128, 64), (96, 96), (128, 128))
ARMS = {
    "muon-ours": ("muon_compile.Muon", "muon"),
    "muon-torch": ("torch.optim.Muon", "muon"),
    "inductor-torch": ("torch.optim.Muon", "inductor"),
    "inductor-ours": ("muon_compile.Muon", "inductor"),
}
PHASES = ("dynamo", "canonicalize", "aot", "post-grad", "ours", "lowering", "scheduling", "codegen", "load", "other")


def _optimizer(name: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if name == "torch.optim.Muon":
        return torch.optim.Muon(params, lr=torch.tensor(0.02))
    import muon_compile

    return muon_compile.Muon(params, lr=0.02)


def _phases(metrics: dict[str, list[float]], ours: dict[str, float], first_call: float) -> dict[str, float]:
    """The first call's seconds per phase (see the module docstring)."""
    t = {k: sum(v) for k, v in metrics.items()}

    def get(key: str) -> float:
        return t.get(key, 0.0)

    out = {
        "dynamo": get("_compile.compile_inner") - get("OutputGraph.call_user_compiler"),
        "canonicalize": ours.get("torch_passes", 0.0),
        "aot": get("create_aot_dispatcher_function") - get("compile_fx_inner"),
        "post-grad": get("_recursive_post_grad_passes"),
        "ours": ours.get("post_grad_passes", 0.0),
        "lowering": get("GraphLowering.run"),
        "scheduling": get("Scheduler.__init__"),
        "codegen": get("GraphLowering.codegen") - get("Scheduler.__init__"),
        "load": get("GraphLowering.compile_to_module") - get("GraphLowering.codegen"),
    }
    out["other"] = first_call - sum(v for k, v in out.items() if k != "ours")  # ours is inside post-grad
    return out


def child(arm: str, n: int, reps: int) -> dict:
    """One process's measurement of ``arm`` with ``n`` matrices."""
    import muon_compile  # noqa: F401  (registers the backend's tracing helpers, as a user's import would)
    from muon_compile.diagnostics.counters import pass_seconds

    opt_name, backend = ARMS[arm]
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(SHAPES[i % len(SHAPES)], generator=gen)) for i in range(n)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    opt = _optimizer(opt_name, params)
    step = torch.compile(opt.step, backend=backend)
    torch._dynamo.utils.compilation_time_metrics.clear()
    pass_seconds.clear()
    clock = Clock()  # the step runs on the CPU
    first = clock.wall_s(step)
    metrics = {k: list(v) for k, v in torch._dynamo.utils.compilation_time_metrics.items()}
    phases = _phases(metrics, dict(pass_seconds), first)
    times = time_steps(step, 0, reps, clock)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    files = len(metrics.get("compile_file", ()))
    cpu_s = sum(metrics.get("compile_file", ()))
    return {
        "first_call": first, "phases": phases, "step_ms": statistics.median(times) * 1e3, "graphs": graphs,
        "kernel_files": files, "compile_cpu_s": cpu_s,
    }


def run_child(arm: str, n: int, reps: int, cache_dir: str, timeout: float) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir}
    cmd = [sys.executable, __file__, "--child", arm, str(n), "--reps", str(reps)]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cell(r: dict, key: str) -> str:
    return r["error"] if "error" in r else f"{r[key]:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="24,96,500,2000", help="comma-separated matrix counts")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {list(ARMS)}")
    parser.add_argument("--reps", type=positive_int, default=5)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per process")
    parser.add_argument("--child", nargs=2, metavar=("ARM", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.reps)))
        return
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}; known: {list(ARMS)}")
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"torch {torch.__version__}, os.cpu_count()={os.cpu_count()}, shapes {SHAPES} cycling; seconds unless marked")
    print(markdown_row(["arm", "N", "cold first call", "warm first call", "graphs", "step ms", *PHASES, "kernel files", "compile cpu-s"]))
    print(markdown_rule("lrrrrr" + "r" * (len(PHASES) + 2)))
    for arm in arms:
        for n in sizes:
            with tempfile.TemporaryDirectory(prefix="bench_compile_") as cache:
                cold = run_child(arm, n, args.reps, cache, args.timeout)
                warm = run_child(arm, n, args.reps, cache, args.timeout) if "error" not in cold else {"error": "-"}
            if "error" in cold:
                work, step = ["-"] * (len(PHASES) + 2), "-"
            else:
                values = [cold["phases"][p] for p in PHASES] + [cold["kernel_files"], cold["compile_cpu_s"]]
                work = [f"{v:.1f}" if isinstance(v, float) else str(v) for v in values]
                step = f"{cold['step_ms']:.1f}"
            row = [arm, str(n), _cell(cold, "first_call"), _cell(warm, "first_call"), str(cold.get("graphs", "-")), step, *work]
            print(markdown_row(row), flush=True)


if __name__ == "__main__":
    main()

"""The CPU heap the ``muon`` backend keeps (:mod:`muon_compile.compile.cpu_heap`) against glibc's own
settings: one step of ``scripts/bench_single_device.py``'s workloads and arms, timed
with each.

The heap is the process's, so each setting runs in processes of its own, started alternately
(kept, glibc's, kept, ...; ``--procs`` of each), and a process runs one arm only, as a training
process would: a benchmark process holding every arm's buffers at once has a heap no trainer
has. Each process prints its step's median and its minor page faults a step (``getrusage``);
the report gives, per setting, the median of its processes' medians and of their faults.

    python scripts/bench_cpu_heap.py --workload gpt-small,many-small --arms muon,muon-torch --procs 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

import torch

from bench_common import clock_for, machine_info, machine_line, time_steps
from bench_single_device import ARMS, WORKLOADS, format_table

SETTINGS = (("kept", None), ("glibc's", "0"))  # (name, MUON_COMPILE_CPU_HEAP_MB; None: the default)


def child(workload: str, arm_key: str, warmup: int, reps: int) -> dict:
    """One arm's step on ``workload`` in this process: median seconds and faults a step."""
    device = torch.device("cpu")
    machine = machine_info(device)  # keeps the heap unless MUON_COMPILE_CPU_HEAP_MB=0, as the backend would
    arm = next(a for a in ARMS if a.key == arm_key)
    step = arm.make_step(WORKLOADS[workload], device)
    step = step if arm.backend is None else arm.compile(step)
    clock = clock_for(device)
    time_steps(step, warmup, 0, clock)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = time_steps(step, 0, reps, clock)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / reps
    return {"median_s": statistics.median(times), "faults": faults, "machine": machine}


def run_child(workload: str, arm: str, heap_mb: str | None, args: argparse.Namespace, cache: str) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    env.pop("MUON_COMPILE_CPU_HEAP_MB", None)
    if heap_mb is not None:
        env["MUON_COMPILE_CPU_HEAP_MB"] = heap_mb
    command = [sys.executable, __file__, "--child", workload, arm, "--warmup", str(args.warmup), "--reps", str(args.reps)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="gpt-small,many-small", help="comma list of bench_single_device's workloads")
    parser.add_argument("--arms", default="muon", help="comma list of bench_single_device's arm keys (default muon)")
    parser.add_argument("--procs", type=int, default=3, help="processes of each setting per arm (default 3)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--reps", type=int, default=15, help="timed steps a process (default 15)")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "ARM"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.warmup, args.reps)))
        return
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in {arm.key for arm in ARMS}]
    if unknown:
        parser.error(f"unknown arms: {unknown}")
    rows, machine = [], None
    with tempfile.TemporaryDirectory() as cache:  # one Inductor cache: the later processes compile warm
        for workload in args.workload.split(","):
            for arm in arms:
                runs: dict[str, list[dict]] = {name: [] for name, _ in SETTINGS}
                for _ in range(args.procs):
                    for name, heap_mb in SETTINGS:
                        runs[name].append(run_child(workload, arm, heap_mb, args, cache))
                machine = runs["kept"][0]["machine"]
                medians = {name: statistics.median(r["median_s"] for r in got) * 1e3 for name, got in runs.items()}
                for name, got in runs.items():
                    each = ", ".join(f"{r['median_s'] * 1e3:.2f}" for r in got)
                    faults = statistics.median(r["faults"] for r in got)
                    ratio = medians["glibc's"] / medians[name]
                    rows.append([workload, arm, name, f"{medians[name]:.2f}", each, f"{faults:.0f}", f"{ratio:.2f}x"])
    print(machine_line(machine) + f" (kept; glibc's: MUON_COMPILE_CPU_HEAP_MB=0); {args.procs} processes a setting, "
          f"alternated; median of {args.reps} steps after {args.warmup}")
    header = ["workload", "arm", "heap", "step ms (median)", "each process", "minor faults/step", "glibc's / this"]
    print(format_table(rows, header))


if __name__ == "__main__":
    main()

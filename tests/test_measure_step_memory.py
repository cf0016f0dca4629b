"""scripts/measure_step_memory.py: the peak of a process's resident set around a call,
and, in the slow tier, the script end to end on one gloo rank."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import measure_step_memory  # noqa: E402
from bench_distributed import WORKLOADS  # noqa: E402
from muon_compile.config import Strategy  # noqa: E402
from muon_compile.plan import plan_for  # noqa: E402
from muon_compile.step_cost import buffer_bytes  # noqa: E402

MiB = 2**20


def test_peak_growth_sees_a_tensor_freed_before_the_call_returns():
    def transient():
        x = torch.ones(64 * MiB // 4)  # 64 MiB, touched; above glibc's largest mmap threshold
        return float(x[-1])

    assert measure_step_memory.peak_growth(transient, gpu=False) >= 63 * MiB
    assert measure_step_memory.peak_growth(lambda: None, gpu=False) < 8 * MiB


@pytest.mark.slow
def test_script_prints_each_configuration_beside_the_estimate():
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
               str(ROOT / "scripts" / "measure_step_memory.py"), "--backend", "gloo", "--workload", "small-14",
               "--bucket-mb", "64", "--reps", "1"]
    env = {k: v for k, v in os.environ.items() if k != measure_step_memory.MMAP_THRESHOLD}
    refused = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert refused.returncode != 0 and "set MALLOC_MMAP_THRESHOLD_" in refused.stderr
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True,
                         env={**env, measure_step_memory.MMAP_THRESHOLD: "65536"}).stdout
    assert f"exact to within {measure_step_memory.rss_counter_slack() / MiB:.2f} MiB" in out.splitlines()[0]
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("64 ")]
    assert [(r[1], r[2]) for r in rows] == [("all_to_all", "0"), ("all_to_all", "1"), ("all_gather", "0"), ("all_gather", "1")]
    for row in rows:  # beside each measured peak, the planner's estimate of the same plan
        estimate = buffer_bytes(plan_for(WORKLOADS["small-14"], 1, Strategy(row[1]), 64.0), int(row[2]))
        assert estimate > 0 and row[4] == f"{estimate / MiB:.2f}"
        # the peak can read below zero by the kernel counters' slack, never further
        assert float(row[3]) >= -measure_step_memory.rss_counter_slack() / MiB

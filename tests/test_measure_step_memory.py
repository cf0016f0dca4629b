"""scripts/measure_step_memory.py: the peak of a process's resident set around a call,
made to follow its allocations, and, in the slow tier, the script end to end on one gloo
rank."""

import json
from pathlib import Path

import pytest
import torch
from script_runs import python, torchrun

ROOT = Path(__file__).resolve().parents[1]

import measure_step_memory  # noqa: E402
from bench_distributed import WORKLOADS  # noqa: E402
from muon_compile.config import Strategy  # noqa: E402
from muon_compile.plan import plan_for  # noqa: E402
from muon_compile.step_cost import buffer_bytes  # noqa: E402

MiB = 2**20


GROWTHS = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import measure_step_memory as m

def transient():  # 64 MiB, written, freed before the call returns
    return float(torch.ones(2**24)[-1])

def untouched():  # 32 MiB allocated, never written, and 1 MiB written while it lives
    x, y = torch.empty(2**23), torch.ones(2**18)
    return x.numel() + y.numel()

def growth(fn):  # the largest of three reads: pages of mapped files dropped during one lower it
    return max(m.peak_growth(fn, gpu=False) for _ in range(3))

before = growth(untouched)
m.follow_allocations()
print(json.dumps({"untouched before": before, "transient": growth(transient), "untouched": growth(untouched),
                  "nothing": growth(lambda: None)}))
"""


def test_the_resident_set_follows_allocations_once_told_to():
    """In a process of its own, as mallopt's settings last for the process."""
    out = python("-c", GROWTHS, str(ROOT / "scripts"), timeout=120).stdout
    growth = {k: v / MiB for k, v in json.loads(out).items()}
    short = measure_step_memory.RESIDENT_SET_SHORTFALL / MiB
    assert growth["untouched before"] < 8, growth  # glibc alone: the unwritten 32 MiB is not resident
    assert 64 - short <= growth["transient"] < 64 + 8, growth
    assert 33 - short <= growth["untouched"] < 33 + 8, growth
    assert growth["nothing"] < 1, growth


@pytest.mark.slow
def test_script_prints_each_configuration_beside_the_estimate():
    out = torchrun(
        "measure_step_memory.py", "--backend", "gloo", "--workload", "small-14", "--bucket-mb", "64", "--reps", "1",
        world=1, timeout=600,
    ).stdout
    short = measure_step_memory.RESIDENT_SET_SHORTFALL / MiB
    assert f"resident-set peaks may read up to {short:g} MiB short" in out.splitlines()[0]
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("64 ")]
    assert [(r[1], r[2]) for r in rows] == [("all_to_all", "0"), ("all_to_all", "1"), ("all_gather", "0"), ("all_gather", "1")]
    for row in rows:  # beside each measured peak, the planner's estimate of the same plan
        estimate = buffer_bytes(plan_for(WORKLOADS["small-14"], 1, Strategy(row[1]), 64.0), int(row[2]))
        assert estimate > 0 and row[4] == f"{estimate / MiB:.2f}"
        # small-14's tensors are under the mmap threshold: about zero, never further below than that
        assert float(row[3]) >= -short

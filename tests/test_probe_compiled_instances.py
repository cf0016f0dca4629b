"""scripts/probe_compiled_instances.py: a one-rank gloo run compiles a fixed-cost step
twice and reports each count's times, alone and in turns, and Dynamo's cache lookup."""

import re

import pytest
from script_runs import torchrun


@pytest.mark.slow
def test_each_instance_count_is_timed_and_the_cache_lookup_reported():
    out = torchrun(
        "probe_compiled_instances.py", "--workload", "1 x 8x8", "--instances", "2", "--reps", "3", world=1, timeout=300,
    ).stdout
    rows = re.findall(r"^1 x 8x8, (\d) instances: first alone ([\d.]+) ms, newest alone ([\d.]+) ms, in turns ([\d.]+) ms per call$",
                      out, re.MULTILINE)
    assert [int(r[0]) for r in rows] == [1, 2], out
    assert all(float(t) > 0 for r in rows for t in r[1:])
    first, newest = map(float, re.search(r"cache lookup per call: first instance ([\d.]+) us, newest ([\d.]+) us", out).groups())
    assert first > 0 and newest > 0  # the guards of a compiled call are checked on every call

"""scripts/probe_step_after.py: a world-2 gloo run times the one-bucket small-14 step after
each of its preludes and prints every prelude's median and quartiles."""

import re
import subprocess
import sys

import pytest
from script_runs import SCRIPTS, torchrun

PRELUDES = ("nothing", "twin", "other step", "bf16 product", "matmul probe", "write 64 MiB", "sleep 5 ms")


@pytest.mark.slow(seconds=90)
def test_every_prelude_is_reported():
    out = torchrun("probe_step_after.py", "--blocks", "1", "--reps", "3", world=2, timeout=300).stdout
    assert "after each prelude (1 blocks of 3 steps, ms):" in out, out
    for name in PRELUDES:
        line = re.search(rf"^  {re.escape(name)} +median +([0-9.]+)  quartiles +([0-9.]+) +([0-9.]+)$", out, re.M)
        assert line, (name, out)
        q1, median, q3 = float(line.group(2)), float(line.group(1)), float(line.group(3))
        assert 0 < q1 <= median <= q3, line.group(0)


def test_bad_counts_are_usage_errors():
    run = subprocess.run(
        [sys.executable, str(SCRIPTS / "probe_step_after.py"), "--blocks", "0"],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 2 and "--blocks 0 --reps 30: at least 1 each" in run.stderr, run.stderr

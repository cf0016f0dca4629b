"""scripts/profile_step.py: a world-2 gloo run prints the compiled step's matmuls and the
kernels Inductor generated, by name."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_profile_step_lists_the_matmuls_and_the_generated_kernels():
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(ROOT / "scripts" / "profile_step.py"),
         "--workload", "small-14", "--steps", "1", "--rows", "40"],
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout
    assert "step: median" in out
    assert "aten::bmm" in out and "cpp_fused" in out, out

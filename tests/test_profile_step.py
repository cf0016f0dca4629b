"""scripts/profile_step.py: a world-2 gloo run prints the compiled step's matmuls and the
kernels Inductor generated, by name, every rank's measured split of the step, and the
cost model's split of the same plan from a saved validation run."""

from pathlib import Path

import pytest
from script_runs import torchrun

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "docs" / "runs" / "2026-11-25-world2-realtime.json"


@pytest.mark.slow
def test_profile_step_lists_the_matmuls_the_generated_kernels_and_both_splits():
    out = torchrun(
        "profile_step.py", "--workload", "small-14", "--steps", "2", "--rows", "40", "--predict-from", str(SAVED),
        world=2, timeout=600,
    ).stdout
    assert "step: median" in out
    assert "aten::bmm" in out and "cpp_fused" in out, out
    lines = out.splitlines()
    measured = lines[lines.index("rank         wall       matmul      kernels  collectives         rest") + 1 :][:2]
    for rank, line in enumerate(measured):
        wall, matmul, kernels, collectives, rest = map(float, line.split()[1:])
        assert int(line.split()[0]) == rank
        assert matmul > 0 and kernels > 0 and collectives > 0  # kernels named: enable_kernel_profile
        assert matmul + kernels + collectives + rest == pytest.approx(wall, abs=2e-3)
    predicted = lines[lines.index("rank        total           NS    pointwise        fixed      exposed") + 1 :][:2]
    for line in predicted:
        total, ns, pointwise, fixed, exposed = map(float, line.split()[1:])
        assert ns > 0 and fixed > 0 and ns + pointwise + fixed + exposed == pytest.approx(total, abs=2e-3)

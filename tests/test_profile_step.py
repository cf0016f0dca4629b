"""scripts/profile_step.py: a world-2 gloo run prints the compiled step's matmuls and the
kernels Inductor generated, by name, every rank's measured split of the step, and the
cost model's split of the same plan from a saved validation run; with ``--host``, the
host's side of a fixed-cost step and a Chrome trace."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from bench_distributed import WORKLOADS
from measure_profiles import FIXED_COST_WORKLOADS
from profile_step import launches, workload_shapes
from script_runs import torchrun

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "docs" / "runs" / "2026-11-25-world2-realtime.json"


@pytest.mark.slow(seconds=60)
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


def test_launches_counts_the_host_launch_calls_and_the_device_kernels_per_step():
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    events = [
        SimpleNamespace(key="cudaLaunchKernel", count=6, device_type=cpu),
        SimpleNamespace(key="cuLaunchKernelEx", count=9, device_type=cpu),
        SimpleNamespace(key="aten::bmm", count=30, device_type=cpu),
        SimpleNamespace(key="triton_poi_fused_0", count=9, device_type=cuda),
        SimpleNamespace(key="sm90_xmma_gemm_bf16", count=6, device_type=cuda),
    ]
    assert launches(events, 3) == (5, 5)


def test_scale_multiplies_every_side_of_a_workload():
    assert workload_shapes("24 shapes") == FIXED_COST_WORKLOADS["24 shapes"][0]
    assert workload_shapes("24 shapes", 16) == [(16 * r, 16 * c) for r, c in FIXED_COST_WORKLOADS["24 shapes"][0]]
    assert workload_shapes("small-14", 2)[0] == tuple(2 * side for side in WORKLOADS["small-14"][0])


@pytest.mark.slow
def test_profile_step_host_view_of_a_fixed_cost_step_and_its_trace(tmp_path):
    trace = tmp_path / "trace.json"
    out = torchrun(
        "profile_step.py", "--workload", "1 x 8x8", "--scale", "4", "--host", "--steps", "2", "--trace", str(trace),
        world=1, timeout=600,
    ).stdout
    assert "# 1 x 8x8 (x4 sizes), all_to_all" in out, out
    # the CPU launches no kernels: Inductor's C++ kernels are calls of the host
    assert "0 kernel launch calls, 0 device kernels per step" in out, out
    assert "TorchDynamo Cache Lookup" in out  # the host's self time per op, not the kernels'
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert "aten::bmm" in names

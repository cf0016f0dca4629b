"""scripts/gpu_check.sh, every step run on this CPU (``--device cpu``: a tiny workload, the
calibration at small sizes): a GPU machine's few minutes are not spent finding a missing file
or a typo. The figures are not checked, only that each step ran and said what it did."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from script_runs import ROOT

# the arms gpu_check.sh runs; a peer without its package installed is reported as failed
COMPILED = (
    "inductor torch.optim.Muon", "muon muon_compile.Muon (auto)", "muon muon_compile.Muon (auto), CUDA graph",
    "muon muon_compile.Muon (auto), symmetric products",
)
OTHERS = ("eager torch.optim.Muon", "roofline", "roofline (products chosen)")
# the peers' arms and the module each needs: HeavyBall is in the test extra (tests/users/test_released.py),
# so its arm runs; the others are installed on a GPU machine only, from vendor/wheels
PEERS = {"emerging": "emerging_optimizers", "heavyball": "heavyball", "dion": "dion"}


@pytest.mark.slow(seconds=40)
def test_every_step_runs_on_the_cpu(tmp_path):
    # no peer wheels: the test's own environment stays as it is (a peer it lacks says "not installed")
    env = dict(os.environ, PYTHON=sys.executable, GPU_CHECK_WHEELS=str(tmp_path / "no-wheels"))
    run = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert run.returncode == 0, f"{run.stdout[-4000:]}\n--- stderr ---\n{run.stderr[-4000:]}"
    summary = run.stdout
    assert "tiny (4 matrices" in summary, summary
    bench = json.loads((tmp_path / "bench_single.json").read_text())
    assert bench["device"] == "cpu" and bench["compile_workers"] == 2 and bench["kept_cache"]
    arms = {a["name"]: a for a in bench["workloads"][0]["arms"]}
    for name in COMPILED:
        assert arms[name]["error"] is None and arms[name]["median_s"] > 0, arms[name]
        assert arms[name]["cold_compile_s"] > 0 and arms[name]["launches"]["products"] > 0, arms[name]
    for name in OTHERS:
        assert arms[name]["error"] is None and arms[name]["median_s"] > 0, arms[name]
    trace = json.loads((tmp_path / "traces" / "tiny-muon.json").read_text())  # the muon arm's profiled step
    assert any(e.get("name") == "aten::bmm" for e in trace["traceEvents"]), "no product in the trace"
    peers = [a for a in arms.values() if a["key"] in PEERS]
    assert [a["key"] for a in peers] == list(PEERS)
    for arm in peers:
        if importlib.util.find_spec(PEERS[arm["key"]]) is None:
            assert "not installed" in arm["error"], arm
        else:
            assert arm["error"] is None and arm["median_s"] > 0, arm
    sym = json.loads((tmp_path / "bench_sym.json").read_text())
    kinds = [("gram", 32), ("square", 32), ("gram", 64), ("square", 64)]
    assert [(r["dtype"], r["kind"], r["m"]) for r in sym["rows"]] == [(d, *k) for d in ("bf16", "fp16") for k in kinds]
    assert all(r["max_diff"] == 0 for r in sym["rows"]), sym  # off CUDA the op is bmm itself
    assert sym["table"].startswith("{torch.bfloat16: ((32, ") and "torch.float16: ((32, " in sym["table"]
    assert "symmetric products, gram, bf16, sym / bmm time by m: 32: " in summary and "no Triton kernel on this device" in summary
    epilogue = json.loads((tmp_path / "bench_epilogue.json").read_text())
    assert [(r["dtype"], r["m"]) for r in epilogue["rows"]] == [("bf16", 32), ("fp32", 32)]
    assert epilogue["table"].startswith("{torch.bfloat16: ((32, ") and "torch.float32: ((32, " in epilogue["table"]
    assert "textbook scalars, bf16, polynomial / epilogue time by m: 32: " in summary
    orientation = json.loads((tmp_path / "bench_orientation.json").read_text())
    assert orientation["compare"] == "orientation" and [r["shape"] for r in orientation["rows"]] == ["128x32"] * 2
    assert orientation["table"].startswith("{torch.bfloat16: ((32, ") and "torch.float32: ((32, " in orientation["table"]
    assert "tall layout, fp32, transposed / native time by m: 32: " in summary
    write = json.loads((tmp_path / "bench_write.json").read_text())
    assert [(r["stack"], r["transposed"]) for r in write["rows"]] == [("4x32x64", False), ("4x64x32", True)]
    assert all(r["max_diff"] < 1e-6 for r in write["rows"]), write  # the op's fallback against the foreach write
    assert "stacks' write, write / before time by stack: 4x32x64: " in summary and "no Triton kernel on this device" in summary
    assert (tmp_path / "tests.log").read_text().startswith("--device cpu: no CUDA tests")
    assert "calibrate: cpu-calibrated: bf16 peak" in summary, summary
    assert "distributed: 0 GPU(s) on cpu: the distributed benchmark needs 2 or more (skipped)" in summary

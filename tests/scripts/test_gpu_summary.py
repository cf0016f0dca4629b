"""scripts/gpu_summary.py: the short table of a gpu_check.sh report folder, here a made-up
one with every step's file (the profile in the advisor's file format), and an empty one. The
script runs in this process (its ``main``): a fresh interpreter would spend its seconds importing
torch (40 s on the CUDA builds of CI's fast tiers), not reading the folder."""

import importlib.util
import json
from pathlib import Path

from script_runs import SCRIPTS

SCRIPT = SCRIPTS / "gpu_summary.py"


def summary(report: Path, capsys) -> list[str]:
    """The lines ``python scripts/gpu_summary.py REPORT`` prints (it must exit with 0)."""
    spec = importlib.util.spec_from_file_location("gpu_summary", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capsys.readouterr()
    assert module.main([str(report)]) == 0
    return capsys.readouterr().out.splitlines()


def write_report(folder: Path) -> None:
    """A report folder as gpu_check.sh leaves it after every step, on one GPU."""
    (folder / "environment.txt").write_text(
        "date: 2026-11-27 13:43 UTC\nhost: Some CPU, 16 cpus\ntorch 2.11.0+cu130 cuda 13.0 gpus 1 NVIDIA H200\nnvidia-smi ...\n"
    )
    arm = {"cold_compile_s": None, "warm_compile_s": None, "matmul_calls": 45, "error": None}
    (folder / "bench_single.json").write_text(json.dumps({"device": "cuda", "workloads": [{
        "workload": "gpt-small", "matrices": 24, "ns_gflop": 95.127, "arms": [
            {**arm, "key": "eager-torch", "name": "eager torch.optim.Muon", "times_s": [0.0154], "median_s": 0.0154},
            {**arm, "key": "muon", "name": "muon muon_compile.Muon (auto)", "times_s": [0.0035], "median_s": 0.0035,
             "gpu_kernels": 77, "cold_compile_s": 21.4, "kernel_ms": {"products": 1.125, "generated": 0.5, "other": 0.25}},
            {**arm, "key": "roofline", "name": "roofline", "times_s": [0.0014], "median_s": 0.0014},
            {**arm, "key": "dion", "name": "dion Muon", "times_s": None, "median_s": None, "error": "RuntimeError: boom"},
        ],
    }]}))
    row = {"k": 0, "batch": 1, "bmm_ms": 1.0, "sym_ms": 0.6, "bmm_tflops": 1.0, "sym_tflops": 1.6, "max_diff": 0.0}
    (folder / "bench_sym.json").write_text(json.dumps({"kernel": "the Triton kernel", "rows": [
        {**row, "kind": "gram", "m": 256, "ratio": 1.25}, {**row, "kind": "square", "m": 256, "ratio": 1.5},
        {**row, "kind": "gram", "m": 4096, "ratio": 0.6},
    ]}))
    (folder / "bench_epilogue.json").write_text(json.dumps({"table": "{torch.bfloat16: ((256, 1.100), (1024, 0.950),)}", "rows": [
        {"dtype": "bf16", "m": 256, "ratio": 1.1}, {"dtype": "bf16", "m": 1024, "ratio": 0.95},
    ]}))
    (folder / "bench_orientation.json").write_text(json.dumps({"table": "{torch.bfloat16: ((2048, 0.900),)}", "rows": [
        {"dtype": "bf16", "m": 2048, "ratio": 0.9},
    ]}))
    (folder / "bench_write.json").write_text(json.dumps({"kernel": "the Triton kernel", "rows": [
        {"stack": "64x2048x2048", "ratio": 0.42, "write_gbps": 4012.3},
        {"stack": "32x8192x2048", "ratio": 0.45, "write_gbps": 3890.0},
    ]}))
    (folder / "junit.xml").write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="40" failures="1" '
        'errors="0" skipped="3" time="181.2"></testsuite></testsuites>'
    )
    (folder / "profile.json").write_text(json.dumps({"version": 1, "device": {
        "name": "calibrated cuda", "source": "python -m muon_compile.advisor.calibrate", "kind": "cuda",
        "matmul": {"source": "measured", "rates": {
            "bfloat16": [[1024, 495268.4], [4096, 764093.1]], "float16": [[1024, 487178.7], [4096, 736406.4]],
        }},
        "memory_bandwidth": 2.79e12,
    }, "network": None}))
    (folder / "bench_distributed.txt").write_text("one GPU: the distributed benchmark needs 2 or more (skipped)\n")


def test_summary_reads_every_step_of_a_report(tmp_path, capsys):
    write_report(tmp_path)
    lines = summary(tmp_path, capsys)
    assert lines == [
        "=== gpu_check summary ===",
        "date: 2026-11-27 13:43 UTC",
        "host: Some CPU, 16 cpus",
        "torch 2.11.0+cu130 cuda 13.0 gpus 1 NVIDIA H200",
        "gpt-small (24 matrices, 95.1 NS GFLOP/step):",
        f"  {'eager torch.optim.Muon':<42}    15.400 ms    4.40x muon   11.00x roofline",
        f"  {'muon muon_compile.Muon (auto)':<42}     3.500 ms    1.00x muon    2.50x roofline  77 kernels  "
        "GPU busy 1.88 ms (1.12 in products)  compiled in 21 s",
        f"  {'roofline':<42}     1.400 ms    0.40x muon    1.00x roofline",
        f"  {'dion Muon':<42} FAILED: RuntimeError: boom",
        "symmetric products, gram, bf16, sym / bmm time by m: 256: 1.25, 4096: 0.60 (the Triton kernel)",
        "symmetric products, square, bf16, sym / bmm time by m: 256: 1.50 (the Triton kernel)",
        "textbook scalars, bf16, polynomial / epilogue time by m: 256: 1.10, 1024: 0.95",
        "textbook scalars, the table for matmul_rates: {torch.bfloat16: ((256, 1.100), (1024, 0.950),)}",
        "tall layout, bf16, transposed / native time by m: 2048: 0.90",
        "tall layout, the table for matmul_rates: {torch.bfloat16: ((2048, 0.900),)}",
        "stacks' write, write / before time by stack: 64x2048x2048: 0.42 (4012 GB/s), 32x8192x2048: 0.45 (3890 GB/s)"
        " (the Triton kernel)",
        "CUDA tests: 36 passed, 1 failed, 0 errors, 3 skipped in 181 s",
        "calibrate: calibrated cuda: bf16 peak 764093 GFLOP/s (at 4096), memory bandwidth 2790.0 GB/s",
        "distributed: one GPU: the distributed benchmark needs 2 or more (skipped)",
    ]


def test_missing_files_are_reported_as_missing(tmp_path, capsys):
    assert summary(tmp_path, capsys) == [
        "=== gpu_check summary ===",
        "environment: missing (no environment.txt)",
        "single-device benchmark: missing (no bench_single.json; see bench_single.log)",
        "symmetric products: missing (no bench_sym.json; see bench_sym.log)",
        "textbook scalars: missing (no bench_epilogue.json; see bench_epilogue.log)",
        "tall layout: missing (no bench_orientation.json; see bench_orientation.log)",
        "stacks' write: missing (no bench_write.json; see bench_write.log)",
        "CUDA tests: missing (no junit.xml; see tests.log)",
        "calibrate: missing (no profile.json; see calibrate.txt)",
        "distributed: missing (no bench_distributed.txt)",
    ]


def test_a_profile_the_advisor_cannot_load_is_reported_with_why(tmp_path, capsys):
    (tmp_path / "profile.json").write_text(json.dumps({"version": 1, "device": {"name": "x"}}))
    lines = summary(tmp_path, capsys)
    assert [line for line in lines if line.startswith("calibrate:")] == [
        f"calibrate: profile.json does not load: profile {tmp_path / 'profile.json'}: device.kind: missing"
    ]

"""scripts/gpu_summary.py: the short table of a gpu_check.sh report folder, here a made-up
one with the environment, the validation's summary and the host step's lines."""

from pathlib import Path

from script_runs import python

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_summary.py"


def test_summary_reads_the_machine_the_validation_and_the_host_step(tmp_path):
    (tmp_path / "environment.txt").write_text(
        "date: 2026-11-27 13:43 UTC\nhost: Some CPU, 16 cpus\ntorch 2.11.0+cu130 cuda 13.0 gpus 1 NVIDIA H200\nnvidia-smi ...\n"
    )
    (tmp_path / "validate_world1.txt").write_text("table\n8 pairs: median |error| 25.2%, worst 43.4%, within 20%: 4/8\n")
    (tmp_path / "host.txt").write_text(
        "# gpt-small, all_to_all, bucket 64 MiB, prefetch 1, world 1 (nccl)\nstep: median 3.94 ms\n"
        "host: issued a step in 3.83 ms (median of 7, slowest rank), 7.55 ms per profiled step; 217 kernel launch calls, "
        "217 device kernels per step\n    1.807      1 calls  ## Call CompiledFxGraph ##\n"
    )
    out = python(str(SCRIPT), str(tmp_path), timeout=60).stdout
    lines = out.splitlines()
    assert lines[1:4] == ["date: 2026-11-27 13:43 UTC", "host: Some CPU, 16 cpus", "torch 2.11.0+cu130 cuda 13.0 gpus 1 NVIDIA H200"]
    assert "cost model, one GPU: 8 pairs: median |error| 25.2%, worst 43.4%, within 20%: 4/8" in lines
    assert lines[-2:] == [
        "# gpt-small, all_to_all, bucket 64 MiB, prefetch 1, world 1 (nccl)",
        "host: issued a step in 3.83 ms (median of 7, slowest rank), 7.55 ms per profiled step; 217 kernel launch calls, "
        "217 device kernels per step",
    ]
    assert "CUDA tests: no junit.xml (the test step did not run)" in lines  # missing: reported, not an error

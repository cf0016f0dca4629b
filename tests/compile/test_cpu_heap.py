"""The CPU heap settings (:mod:`muon_compile.compile.cpu_heap`): what they change (page faults of a
step's fresh buffers, in a process of its own) and when the backend makes them."""

import textwrap

import pytest
import torch

import muon_compile
from muon_compile import config
from muon_compile.compile import cpu_heap
from muon_compile.diagnostics import explain
from script_runs import python

needs_glibc = pytest.mark.skipif(cpu_heap._glibc() is None, reason="the settings are glibc's")

# Six 20 MiB buffers alive at once, written and freed, as a step's intermediates are. glibc's
# own dynamic thresholds make the faults of such rounds erratic (from none to every page, run to
# run, on this project's VM, glibc 2.36), so the rounds first run under glibc's static defaults
# (128 KiB for both thresholds: each buffer mapped and unmapped, all 6 x 5,120 pages faulted in
# each round), then kept: the freed buffers reused (30,726 pages a round, then none, there).
_ROUNDS = textwrap.dedent(
    """
    import resource, torch
    from muon_compile.compile import cpu_heap

    def faults_a_round(rounds=8):
        start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(rounds):
            buffers = [torch.empty(5 << 20).fill_(1.0) for _ in range(6)]
            del buffers
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / rounds

    libc = cpu_heap._glibc()
    assert libc.mallopt(cpu_heap.M_MMAP_THRESHOLD, 128 << 10) == libc.mallopt(cpu_heap.M_TRIM_THRESHOLD, 128 << 10) == 1
    faults_a_round(2)
    before = faults_a_round()
    kept = cpu_heap.keep(256)
    faults_a_round(2)
    print(before, faults_a_round(), kept)
    """
)


@needs_glibc
@pytest.mark.slow
def test_a_kept_heap_reuses_freed_buffers_without_page_faults():
    before, after, kept = python("-c", _ROUNDS, timeout=120).stdout.split()
    assert int(kept) == 256
    assert float(before) > 6 * 5120 * 0.9  # glibc's static defaults: every page faulted in again each round
    assert float(after) < float(before) / 10  # kept: most of the round's pages reused


def test_a_heap_left_as_it_is_is_not_touched(monkeypatch):
    monkeypatch.setattr(cpu_heap, "_glibc", lambda: pytest.fail("MUON_COMPILE_CPU_HEAP_MB=0 looked for glibc"))
    assert cpu_heap.keep(0) == cpu_heap.kept_mib()


@pytest.fixture
def keeps(monkeypatch) -> list[int]:
    """The ``cpu_heap.keep`` calls made in the test, recorded (the process's heap untouched)."""
    calls: list[int] = []
    monkeypatch.setattr(cpu_heap, "keep", lambda mib: calls.append(mib) or mib)
    return calls


def _compile_on(example: torch.Tensor) -> None:
    torch._dynamo.reset()
    torch.compile(lambda x: x * 2 + 1, backend="muon")(example)


def test_a_graph_compiled_for_the_cpu_keeps_the_heap_and_says_so(keeps):
    _compile_on(torch.ones(4, 4))
    assert keeps == [256]
    assert "CPU heap: up to 256 MiB of freed memory kept" in str(explain.reports()[-1])
    with config.override(cpu_heap_mb=0):
        _compile_on(torch.ones(4, 4))
    assert keeps == [256, 0]
    assert "CPU heap" not in str(explain.reports()[-1])


def test_only_zero_d_cpu_inputs_are_not_a_cpu_graph():
    assert cpu_heap.runs_on_cpu([torch.ones(3), 2.0])
    assert not cpu_heap.runs_on_cpu([torch.tensor(0.02), torch.tensor(0.95), 3])
    assert not cpu_heap.runs_on_cpu([torch.ones(3, device="meta")])


def test_the_setting_is_checked():
    with pytest.raises(ValueError, match="MUON_COMPILE_CPU_HEAP_MB must be >= 0"):
        config.from_env({"MUON_COMPILE_CPU_HEAP_MB": "-1"})
    assert config.from_env({"MUON_COMPILE_CPU_HEAP_MB": "64"}).cpu_heap_mb == 64
    assert muon_compile.config.Config().cpu_heap_mb == 256


@needs_glibc
@pytest.mark.slow
def test_the_heap_benchmark_runs_both_settings_in_processes_of_their_own():
    from script_runs import SCRIPTS

    out = python(str(SCRIPTS / "bench_cpu_heap.py"), "--workload", "tiny", "--procs", "1", "--warmup", "1", "--reps", "2",
                 timeout=600).stdout
    assert "CPU heap keeps 256 MiB freed (kept" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("tiny ")]
    assert [row[2] for row in rows] == ["kept", "glibc's"], out


def test_the_ops_first_eager_cpu_call_keeps_the_heap(keeps):
    X = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    muon_compile.newton_schulz(X)
    with config.override(cpu_heap_mb=64):
        muon_compile.newton_schulz(X)
    assert keeps == [256, 64]

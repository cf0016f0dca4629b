"""scripts/probe_collective_after_compute.py: a world-2 gloo run prints, for each
collective kind of the step, its cost back to back and after products lasting about each
gap, and the difference of the two; with ``--realtime-gloo``
(bench_distributed.prioritize_gloo_threads) it raises gloo's threads to real-time
priority, or stops with a usage error naming the right it lacks; its backend is gloo by
default, also where nccl is the other scripts' default."""

import re
import subprocess

from script_runs import torchrun

# "after" is the difference of two timings (the products followed by the call, less the
# products alone), so on a loaded host it can come out below zero, as "extra" can
ROW = re.compile(r"^(all_to_all_single|all_gather_into_tensor) +(\d+) +([0-9.]+) +([0-9.]+) +(-?[0-9.]+) +([+-][0-9.]+)$")


def probe(*flags: str, check: bool = True) -> subprocess.CompletedProcess:
    return torchrun("probe_collective_after_compute.py", "--sizes", "4", *flags, world=2, timeout=120, check=check)


def test_each_kind_is_timed_alone_and_after_compute():
    out = probe("--gaps", "0,0.5", "--reps", "1").stdout
    assert out.startswith("# world 2, gloo, torch "), out
    rows = [ROW.match(line) for line in out.splitlines()[2:]]
    assert all(rows) and len(rows) == 4, out
    # per kind, the gap 0 row (no products: its compute column exactly 0) then the 0.5 one
    assert [m.group(1) for m in rows] == ["all_to_all_single"] * 2 + ["all_gather_into_tensor"] * 2, out
    assert [float(m.group(3)) == 0 for m in rows] == [True, False] * 2, out
    for m in rows:
        kib, gap, alone, after, extra = int(m.group(2)), *(float(m.group(i)) for i in range(3, 7))
        assert kib == 4 and alone > 0 and gap >= 0, m.group(0)
        assert abs(extra - (after - alone)) <= 0.0015, m.group(0)  # printed to the microsecond


def test_realtime_gloo_raises_every_gloo_thread_or_names_the_right_it_lacks():
    run = probe("--gaps", "0", "--reps", "1", "--realtime-gloo", check=False)
    if run.returncode:  # not root: the usage error, before any timing
        assert "--realtime-gloo: cannot raise thread" in run.stderr and "CAP_SYS_NICE" in run.stderr, run.stderr
        return
    # the threads the group started (its TCP loop, unnamed in torch 2.11, and its two
    # workers), counted as read back in SCHED_FIFO
    assert run.stdout.startswith("# world 2, gloo, 3 gloo threads real-time, torch "), run.stdout
    assert len(run.stdout.splitlines()) == 4, run.stdout


def test_the_backend_is_gloo_by_default_also_where_nccl_is_the_scripts_default(monkeypatch):
    import bench_distributed
    import probe_collective_after_compute

    monkeypatch.setattr(bench_distributed, "default_backend", lambda: "nccl")  # one GPU per rank
    assert probe_collective_after_compute.command_line().parse_args([]).backend == "gloo"
    assert probe_collective_after_compute.command_line().parse_args(["--backend", "nccl"]).backend == "nccl"

"""scripts/probe_core_sharing.py: a world-2 gloo run times every rank busy, then rank 0
alone while rank 1 waits in a collective, with the CPU the waiting rank used; then the
same products uncut, cut by all_gathers and cut by prefetched all_gathers."""

import re

from script_runs import torchrun


def test_a_waiting_rank_is_reported_with_the_cpu_it_used():
    out = torchrun("probe_core_sharing.py", "--seconds", "0.3", "--stretches", "4", world=2, timeout=120).stdout
    both, alone = (line for line in out.splitlines() if " ranks busy: " in line)
    assert both.startswith("2 of 2 ranks busy: rank 0: ") and "rank 1: waiting" not in both
    assert alone.startswith("1 of 2 ranks busy: rank 0: ")
    waited = re.search(r"rank 1: waiting, ([0-9.]+) CPU s", alone)
    assert waited, alone
    # how much CPU the wait used is the probe's finding (docs/benchmarks.md), not a property
    # of the script: on a loaded host it varies, so only its form is checked
    products = re.search(r"^(\d+) products per rank, every rank busy, 4 all_gathers of 1024 KiB per rank alone: "
                         r"([0-9.]+) s$", out, re.M)
    assert products and int(products.group(1)) >= 4, out
    walls = {}
    for label in ("one stretch", "all_gather after each stretch", "all_gather prefetched"):
        line = re.search(rf"^  {label}: ([0-9.]+) s \(([+-][0-9.]+)%\), waiting ([0-9.]+), ([0-9.]+) s$", out, re.M)
        assert line, (label, out)
        walls[label] = float(line.group(1))
    # the uncut run is the baseline: its own change is 0, and nothing waits in it
    assert re.search(r"^  one stretch: [0-9.]+ s \(\+0\.0%\), waiting 0\.000, 0\.000 s$", out, re.M), out
    assert all(w > 0 for w in walls.values()), walls

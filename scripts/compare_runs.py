"""How reproducible the validation's steps are: the same arms across saved runs.

    python scripts/compare_runs.py docs/runs/RUN.json docs/runs/OTHER.json [...]

For each arm measured in every given run (workload, bucket size, prefetch depth,
strategy; scripts/validate_step_cost.py --save), the medians of its steps in each run,
how far apart they are, and how far the furthest lies from their median across the
runs; per workload, how many of the runs' medians lie more than :data:`LIMIT` from it.
A prediction that hit each arm's cross-run median exactly would miss the measurement of
a single run by that much: the part of a single run's error that no cost model can
remove. Compare runs of the same world size and the same step code.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

LIMIT = 0.2  # the validation's bound on a prediction's relative error


def arm_medians(paths: list[Path]) -> dict[tuple, list[float]]:
    """Per arm ``(workload, bucket MiB, prefetch, strategy)`` measured in every run of
    ``paths``, the median of its steps in each run, in the order of ``paths``."""
    runs = []
    for path in paths:
        record = json.loads(path.read_text())
        runs.append({(s["workload"], s["bucket_mb"], s["prefetch"], s["strategy"]): statistics.median(s["times"])
                     for s in record["steps"] if "times" in s})
    common = set.intersection(*(set(r) for r in runs)) if runs else set()
    return {arm: [r[arm] for r in runs] for arm in sorted(common)}


def report(paths: list[Path], log=print) -> None:
    worlds = {json.loads(p.read_text())["world"] for p in paths}
    if len(worlds) > 1:
        raise SystemExit(f"the runs have different world sizes {sorted(worlds)}: compare runs of one world size")
    log(f"# {len(paths)} runs: {', '.join(p.stem for p in paths)}")
    beyond, count = Counter(), Counter()
    for (name, mb, prefetch, strategy), medians in arm_medians(paths).items():
        center = statistics.median(medians)
        furthest = max(abs(m / center - 1) for m in medians)
        beyond[name] += sum(abs(m / center - 1) > LIMIT for m in medians)
        count[name] += len(medians)
        shown = " ".join(f"{m * 1e3:.2f}" for m in medians)
        log(f"{name:<10} {mb:>6g} MiB {strategy:<10} prefetch {prefetch}: medians {shown} ms, "
            f"max/min {max(medians) / min(medians) - 1:.0%}, furthest from their median {furthest:.0%}")
    for name in count:
        log(f"{name}: {beyond[name]} of {count[name]} run medians lie more than {LIMIT:.0%} from the arm's median across the runs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="saved validation runs (JSON)")
    report(parser.parse_args().runs)


if __name__ == "__main__":
    main()

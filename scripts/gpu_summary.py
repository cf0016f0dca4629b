"""The short table scripts/gpu_check.sh prints last, read from its report folder.

    python scripts/gpu_summary.py REPORT_DIR

Lines: the machine (environment.txt), the CUDA tests' counts (junit.xml), per workload of
bench_single.json each arm's median step time and its ratio to the ``muon`` arm, and
whether the distributed benchmark ran (bench_distributed.txt), the cost model's
summary of its one-GPU validation (validate_world1.txt), and per step of the host step
(host.txt, scripts/profile_step.py --host) its heading and host times. A missing file is
reported as missing, not as a failure of this script.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def tests_line(report: Path) -> str:
    path = report / "junit.xml"
    if not path.exists():
        return "CUDA tests: no junit.xml (the test step did not run)"
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return (
        f"CUDA tests: {passed} passed, {counts['failures']} failed, {counts['errors']} errors, "
        f"{counts['skipped']} skipped in {float(suite.get('time', 0)):.0f} s"
    )


def bench_lines(report: Path) -> list[str]:
    path = report / "bench_single.json"
    if not path.exists():
        return ["single-device benchmark: no bench_single.json (see bench_single.log)"]
    data = json.loads(path.read_text())
    lines = []
    for workload in data["workloads"]:
        arms = workload["arms"]
        muon = next((a["median_s"] for a in arms if a["key"] == "muon" and a["median_s"]), None)
        lines.append(f"{workload['workload']} ({workload['matrices']} matrices, {workload['ns_gflop']:.1f} NS GFLOP/step):")
        for arm in arms:
            if arm["median_s"] is None:
                lines.append(f"  {arm['name']:<42} FAILED: {arm.get('error')}")
                continue
            ratio = f"{arm['median_s'] / muon:6.2f}x muon" if muon else ""
            lines.append(f"  {arm['name']:<42} {arm['median_s'] * 1e3:9.3f} ms  {ratio}")
    return lines


def host_lines(report: Path) -> list[str]:
    path = report / "host.txt"
    if not path.exists():
        return ["host's side: no host.txt (the host step did not run)"]
    # profile_step.py prints "# <workload>, <strategy>, bucket B MiB, ..." then "host: ..."
    return [line for line in path.read_text().splitlines() if line.startswith(("# ", "host: "))]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    report = Path(argv[0])
    env = report / "environment.txt"
    lines = ["=== gpu_check summary ==="]
    lines += env.read_text().splitlines()[:3] if env.exists() else ["environment: missing"]  # date, host, torch
    lines.append(tests_line(report))
    lines += bench_lines(report)
    dist = report / "bench_distributed.txt"
    lines.append("distributed: " + (dist.read_text().strip().splitlines()[0] if dist.exists() and dist.read_text().strip() else "no output"))
    validation = report / "validate_world1.txt"
    summary = [line for line in validation.read_text().splitlines() if " pairs: median |error|" in line] if validation.exists() else []
    lines.append("cost model, one GPU: " + (summary[0] if summary else "no summary (see validate_world1.log)"))
    lines += host_lines(report)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

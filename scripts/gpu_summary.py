"""The short table scripts/gpu_check.sh prints last, read from its report folder.

    python scripts/gpu_summary.py REPORT_DIR

Lines, in the order of gpu_check.sh's steps:

* the machine: the first three lines of environment.txt (date, host CPU, torch and GPUs);
* the single-device benchmark (bench_single.json): per workload, each arm's median step
  time, its ratios to the ``muon`` and the ``roofline`` arms, and where measured its GPU
  kernels per step, its GPU busy time (of it in products) and its cold compile seconds;
* the symmetric products (bench_sym.json): per product kind, the symmetric kernel's time
  over ``bmm``'s at each size, and what ran as the kernel;
* the textbook scalars (bench_epilogue.json): per dtype, the polynomial form's time over the
  epilogue form's at each size, and the table for ``matmul_rates``;
* the tall layout (bench_orientation.json): per dtype, the transposed form's time over the
  native layout's at each size, and the table for ``matmul_rates``;
* the stacks' write (bench_write.json): per stack, the write's time over the foreach
  write's it replaced and its rate in the write's least bytes, and what ran as the write;
* the CUDA tests' counts (junit.xml);
* the calibration (profile.json, read as the advisor reads it,
  :func:`muon_compile.advisor.profiles.load`): the device's peak bf16 matmul rate over the
  sizes measured, its memory bandwidth, and the network's links where it has one;
* the distributed benchmark: the first line of bench_distributed.txt.

A missing file is reported as missing (its step did not run, or failed before writing
it; the step's log says which), not as a failure of this script.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def environment_lines(report: Path) -> list[str]:
    path = report / "environment.txt"
    if not path.exists():
        return ["environment: missing (no environment.txt)"]
    return path.read_text().splitlines()[:3]  # date, host, torch


def bench_lines(report: Path) -> list[str]:
    path = report / "bench_single.json"
    if not path.exists():
        return ["single-device benchmark: missing (no bench_single.json; see bench_single.log)"]
    data = json.loads(path.read_text())
    lines = []
    for workload in data["workloads"]:
        arms = workload["arms"]
        medians = {a["key"]: a["median_s"] for a in arms if a["median_s"]}
        lines.append(f"{workload['workload']} ({workload['matrices']} matrices, {workload['ns_gflop']:.1f} NS GFLOP/step):")
        for arm in arms:
            if arm["median_s"] is None:
                lines.append(f"  {arm['name']:<42} FAILED: {arm.get('error')}")
                continue
            cells = [f"{arm['median_s'] * 1e3:9.3f} ms"]
            cells += [f"{arm['median_s'] / medians[k]:6.2f}x {k}" for k in ("muon", "roofline") if k in medians]
            if arm.get("gpu_kernels") is not None:
                cells.append(f"{arm['gpu_kernels']} kernels")
            if arm.get("kernel_ms"):
                busy = sum(arm["kernel_ms"].values())
                where = "GPU" if data.get("device") == "cuda" else "CPU"
                cells.append(f"{where} busy {busy:.2f} ms ({arm['kernel_ms']['products']:.2f} in products)")
            if arm.get("cold_compile_s") is not None:
                cells.append(f"compiled in {arm['cold_compile_s']:.0f} s")
            lines.append(f"  {arm['name']:<42} " + "  ".join(cells))
    return lines


def sym_lines(report: Path) -> list[str]:
    path = report / "bench_sym.json"
    if not path.exists():
        return ["symmetric products: missing (no bench_sym.json; see bench_sym.log)"]
    data = json.loads(path.read_text())
    lines = []
    for kind in ("gram", "square"):
        rows = [r for r in data["rows"] if r["kind"] == kind and r.get("dtype", "bf16") == "bf16"]
        ratios = ", ".join(f"{r['m']}: {r['ratio']:.2f}" for r in rows)
        lines.append(f"symmetric products, {kind}, bf16, sym / bmm time by m: {ratios or 'none'} ({data['kernel']})")
    if data.get("table"):
        lines.append(f"symmetric products, the table for matmul_rates: {data['table']}")
    return lines


# scripts/bench_epilogue.py's two comparisons: the report's file, the summary's name, what each ratio is
TEXTBOOK = (
    ("bench_epilogue", "textbook scalars", "polynomial / epilogue"),
    ("bench_orientation", "tall layout", "transposed / native"),
)


def textbook_lines(report: Path, stem: str, title: str, ratio: str) -> list[str]:
    path = report / f"{stem}.json"
    if not path.exists():
        return [f"{title}: missing (no {stem}.json; see {stem}.log)"]
    data = json.loads(path.read_text())
    lines = []
    for dtype in sorted({r["dtype"] for r in data["rows"]}):
        ratios = ", ".join(f"{r['m']}: {r['ratio']:.2f}" for r in data["rows"] if r["dtype"] == dtype)
        lines.append(f"{title}, {dtype}, {ratio} time by m: {ratios}")
    lines.append(f"{title}, the table for matmul_rates: {data['table']}")
    return lines


def write_lines(report: Path) -> list[str]:
    path = report / "bench_write.json"
    if not path.exists():
        return ["stacks' write: missing (no bench_write.json; see bench_write.log)"]
    data = json.loads(path.read_text())
    rows = ", ".join(f"{r['stack']}: {r['ratio']:.2f} ({r['write_gbps']:.0f} GB/s)" for r in data["rows"])
    return [f"stacks' write, write / before time by stack: {rows or 'none'} ({data['kernel']})"]


def tests_line(report: Path) -> str:
    path = report / "junit.xml"
    if not path.exists():
        return "CUDA tests: missing (no junit.xml; see tests.log)"
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return (
        f"CUDA tests: {passed} passed, {counts['failures']} failed, {counts['errors']} errors, "
        f"{counts['skipped']} skipped in {float(suite.get('time', 0)):.0f} s"
    )


def calibrate_lines(report: Path) -> list[str]:
    path = report / "profile.json"
    if not path.exists():
        return ["calibrate: missing (no profile.json; see calibrate.txt)"]
    import torch

    from muon_compile.advisor import profiles

    try:
        device, network = profiles.load(path)
    except ValueError as error:
        return [f"calibrate: profile.json does not load: {error}"]
    size, rate = max(device.matmul.tables[torch.bfloat16], key=lambda pair: pair[1])
    lines = [
        f"calibrate: {device.name}: bf16 peak {rate:.0f} GFLOP/s (at {size}), "
        f"memory bandwidth {device.memory_bandwidth / 1e9:.1f} GB/s"
    ]
    if network is not None:
        lines.append(f"calibrate: network {network.name}: intra-node {network.intra.describe()}; inter-node {network.inter.describe()}")
    return lines


def distributed_line(report: Path) -> str:
    path = report / "bench_distributed.txt"
    if not path.exists():
        return "distributed: missing (no bench_distributed.txt)"
    text = path.read_text().strip()
    return "distributed: " + (text.splitlines()[0] if text else "no output (see bench_distributed.log)")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    report = Path(argv[0])
    lines = ["=== gpu_check summary ===", *environment_lines(report), *bench_lines(report), *sym_lines(report)]
    for comparison in TEXTBOOK:
        lines += textbook_lines(report, *comparison)
    lines += write_lines(report)
    lines.append(tests_line(report))
    lines += [*calibrate_lines(report), distributed_line(report)]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

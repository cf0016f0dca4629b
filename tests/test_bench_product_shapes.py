"""scripts/bench_product_shapes.py: every product of the compiled Newton–Schulz of small-14
is reported with a rate and, per pricing rule, a rate and a ratio that follow from its
own shape and time; square products are priced alike by both rules; the totals add the
rows up."""

import re
from pathlib import Path

import pytest
from script_runs import python

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"\s+([0-9.]+)"
ROW = re.compile(r"^\[(\d+), (\d+), (\d+)\] @ \[\d+, \d+, (\d+)\]\s+(\d+)" + NUMBER * 7 + "$")
TOTAL = re.compile(r"^Newton–Schulz products per run: measured ([0-9.]+) ms; cube rule ([0-9.]+) ms, ratio ([0-9.]+); "
                   r"by aspect ([0-9.]+) ms, ratio ([0-9.]+)$", re.M)


@pytest.mark.slow
def test_each_product_is_priced_by_both_rules_against_the_tables_of_the_same_run():
    out = python(str(ROOT / "scripts" / "bench_product_shapes.py"), "--workload", "small-14", "--reps", "2",
                 timeout=600).stdout
    assert "# matmul bf16 GFLOP/s, long inner (x4), by short side: " in out, out
    assert "# matmul bf16 GFLOP/s, long outer (x4), by short side: " in out, out
    rows = [tuple(float(g) for g in m.groups()) for m in map(ROW.match, out.splitlines()) if m]
    # small-14's wide stacks: 4 x 37x64, 4 x 37x96, 4 x 64x96, 2 x 96x96; every algorithm
    # starts from each stack's X X^T
    grams = {(b, m, k, n) for b, m, k, n, *_ in rows if k > m == n}
    assert {(4, 37, 64, 37), (4, 37, 96, 37), (4, 64, 96, 64)} <= grams, out
    measured = rounding = 0.0
    for batch, m, k, n, calls, ms, gflops, size, cube, cube_ratio, aspect, aspect_ratio in rows:
        flops = 2 * batch * m * k * n
        assert calls >= 1 and ms > 0
        # ms is printed to 0.0005 ms, GFLOP/s to 0.05
        assert abs(flops / (ms * 1e-3) / 1e9 - gflops) <= 0.05 + gflops * 0.0005 / ms * 1.01
        assert abs((m * k * n) ** (1 / 3) - size) <= 0.5
        # the ratios printed to 0.005 of rates each printed to 0.05
        for price, ratio in ((cube, cube_ratio), (aspect, aspect_ratio)):
            assert abs(price / gflops - ratio) <= 0.005 + ratio * (0.05 / gflops + 0.05 / price) * 1.01
        if m == k == n:
            assert aspect == cube
        measured += calls * ms
        rounding += calls * 0.0005
    total = TOTAL.search(out)
    assert total, out
    ms, cube, cube_ratio, aspect, aspect_ratio = map(float, total.groups())
    assert abs(ms - measured) <= 0.005 + rounding
    for price, ratio in ((cube, cube_ratio), (aspect, aspect_ratio)):  # each printed to 0.005
        assert abs(ms / price - ratio) <= 0.005 + ratio * (0.005 / ms + 0.005 / price) * 1.01

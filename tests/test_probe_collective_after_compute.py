"""scripts/probe_collective_after_compute.py: a world-2 gloo run prints, for each
collective kind of the step, its cost back to back and after products lasting about each
gap, and the difference of the two."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^(all_to_all_single|all_gather_into_tensor) +(\d+) +([0-9.]+) +([0-9.]+) +([0-9.]+) +([+-][0-9.]+)$")


def test_each_kind_is_timed_alone_and_after_compute():
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(ROOT / "scripts" / "probe_collective_after_compute.py"), "--sizes", "4", "--gaps", "0,0.5", "--reps", "1"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    assert out.startswith("# world 2, gloo, torch "), out
    rows = [ROW.match(line) for line in out.splitlines()[2:]]
    assert all(rows) and len(rows) == 4, out
    seen = {(m.group(1), float(m.group(3)) > 0) for m in rows}
    assert seen == {(k, g) for k in ("all_to_all_single", "all_gather_into_tensor") for g in (False, True)}, out
    for m in rows:
        kib, gap, alone, after, extra = int(m.group(2)), *(float(m.group(i)) for i in range(3, 7))
        assert kib == 4 and alone > 0 and after > 0, m.group(0)
        assert abs(extra - (after - alone)) <= 0.0015, m.group(0)  # printed to the microsecond
        # the products' count is calibrated to the gap asked: within a factor of 3 of 0.5 ms
        assert gap == 0 or 0.5 / 3 < gap < 0.5 * 3, m.group(0)

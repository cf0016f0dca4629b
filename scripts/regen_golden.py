"""Regenerate every golden graph in golden_graphs/ (runs the golden tests with
EXPECTTEST_ACCEPT=1). Review the diff like code and explain it in the commit message."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    env = dict(os.environ, EXPECTTEST_ACCEPT="1")
    tests = sorted(str(p) for p in (ROOT / "tests" / "passes").glob("test_golden*.py"))
    return subprocess.call([sys.executable, "-m", "pytest", "-q", *tests], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())

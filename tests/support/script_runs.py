"""Running a script of scripts/ (or a snippet) in a Python process of its own, as the tests of
those scripts do: output captured as text, a timeout so a hang fails, and a failed run shown
with the end of what it printed."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is tests/support/script_runs.py)
SUPPORT = ROOT / "tests" / "support"
SCRIPTS = ROOT / "scripts"
TAIL = 6000  # characters of each stream shown when a run fails


def python(*args: str, timeout: float, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python args...`` (this interpreter, in ``env`` if given), stopped after ``timeout``
    seconds; with ``check``, a non-zero exit fails the test with the end of both streams,
    which a bare ``CalledProcessError`` would not show."""
    run = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and run.returncode:
        raise AssertionError(
            f"python {' '.join(args)} exited with {run.returncode}\n"
            f"--- stdout (end) ---\n{run.stdout[-TAIL:]}\n--- stderr (end) ---\n{run.stderr[-TAIL:]}"
        )
    return run


def torchrun(script: str, *args: str, world: int, timeout: float, check: bool = True) -> subprocess.CompletedProcess:
    """``scripts/<script>`` with ``args`` on ``world`` local ranks (``torch.distributed.run
    --standalone``), as :func:`python` runs it."""
    return python("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
                  str(SCRIPTS / script), *args, timeout=timeout, check=check)

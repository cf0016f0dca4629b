"""Running a measuring script of scripts/ under torchrun, as the tests of those scripts do."""

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def torchrun(script: str, *args: str, world: int, timeout: float, check: bool = True) -> subprocess.CompletedProcess:
    """``scripts/<script>`` with ``args`` on ``world`` local ranks (``torch.distributed.run
    --standalone``), its output captured as text, stopped after ``timeout`` seconds so a
    hang fails; with ``check``, a non-zero exit raises."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
         str(SCRIPTS / script), *args],
        capture_output=True, text=True, timeout=timeout, check=check,
    )

"""Golden-graph comparison: normalised graph text against files in ``golden_graphs/``.

The files are recorded on the reference torch version (:data:`REFERENCE_TORCH`). Where
another supported version's graph differs (its decompositions, or the code of its own
``torch.optim.Muon``), that version's graph lives in ``golden_graphs/torch-<major.minor>/``
under the same name and is compared instead.

``EXPECTTEST_ACCEPT=1`` (expecttest's switch, read here without it) rewrites the files instead of comparing: on
the reference version the main files, on another version its own folder (only the
graphs that differ from the reference). ``python scripts/regen_golden.py`` does that for
every golden test.
"""

import difflib
import os
from pathlib import Path

import torch

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden_graphs"
REFERENCE_TORCH = "2.13"
ACCEPT = os.environ.get("EXPECTTEST_ACCEPT", "") not in ("", "0")
TORCH = ".".join(torch.__version__.split("+")[0].split(".")[:2])


def _version_path(name: str) -> Path:
    return GOLDEN_DIR / f"torch-{TORCH}" / name


def assert_golden(name: str, text: str) -> None:
    reference = GOLDEN_DIR / name
    own = _version_path(name)
    if ACCEPT:
        if TORCH == REFERENCE_TORCH:
            reference.write_text(text)
        elif reference.exists() and reference.read_text() == text:
            own.unlink(missing_ok=True)
        else:
            own.parent.mkdir(exist_ok=True)
            own.write_text(text)
        return
    path = own if TORCH != REFERENCE_TORCH and own.exists() else reference
    if not path.exists():
        raise AssertionError(f"golden graph {path} is missing; regenerate: python scripts/regen_golden.py")
    expected = path.read_text()
    if text != expected:
        diff = "".join(
            difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(path), "produced", n=2)
        )
        raise AssertionError(
            f"graph differs from {path} (if the change is intended: python scripts/regen_golden.py, "
            f"and say why in the commit message):\n{diff[:20000]}"
        )

"""Golden-graph comparison: normalised graph text against files in ``golden_graphs/``.

``EXPECTTEST_ACCEPT=1`` (read by expecttest) rewrites the files instead of comparing;
``python scripts/regen_golden.py`` does that for every golden test.
"""

import difflib
from pathlib import Path

import expecttest

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden_graphs"


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN_DIR / name
    if expecttest.ACCEPT:
        path.write_text(text)
        return
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

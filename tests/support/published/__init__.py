"""Muon steps as published, one module per implementation (``ENTRY``, or ``ENTRIES`` where one
step gives two entries), each kept in the structure of its source (order of operations, in-place
ops, casts, loggers and helper calls, loop shape, per-iteration coefficients) and written in this suite's own words; each module's header
names the repository, commit and lines it follows and what it leaves out.

Issue 61 collected them: code that runs unmodified in the wild and that the backend did not
recognise or bucket when it was added. ``Entry.today`` says what the backend meets in an
entry not yet recognised; tests/users/test_corpus.py checks that, and that every other entry is
recognised and bucketed like the rest of tests/support/muon_corpus.py.
"""

import importlib

_MODULES = (
    "modded_nanogpt_normuon", "emerging_optimizers_absl", "heavyball",
    "deepspeed_gram", "lucidrains_polar_express", "dion_generator", "dion_megabatch",
    "deepmd_hybrid_muon",
)

_ENTRIES = [getattr(m, "ENTRIES", None) or (m.ENTRY,) for m in (importlib.import_module(f"published.{n}") for n in _MODULES)]
PUBLISHED = {entry.name: entry for entries in _ENTRIES for entry in entries}

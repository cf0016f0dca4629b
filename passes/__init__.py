"""The FX passes of the ``muon`` backend, one module per pass; :mod:`.pipeline` runs them.

Importable as ``muon_compile.passes``; in the repository they live in the top-level
``passes/`` directory.
"""

from .pipeline import MuonGraphPass, new_dump_name, run_passes, run_torch_passes

__all__ = ["MuonGraphPass", "new_dump_name", "run_passes", "run_torch_passes"]

"""The FX passes of the ``muon`` backend, one module per pass; :mod:`.pipeline` runs them."""

from .pipeline import MuonGraphPass, new_dump_name, run_passes, run_torch_passes

__all__ = ["MuonGraphPass", "new_dump_name", "run_passes", "run_torch_passes"]

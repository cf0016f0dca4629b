"""The FX passes of the ``muon`` backend: :mod:`.table` lists them in order, :mod:`.pipeline` runs
them; a pass of several modules has a folder of its own."""

from .pipeline import MuonGraphPass, new_dump_name, run_passes, run_torch_passes

__all__ = ["MuonGraphPass", "new_dump_name", "run_passes", "run_torch_passes"]

"""``python -m muon_compile.planner``: see :mod:`muon_compile.planner.recommend`."""

from .recommend import main

main()

"""``python -m muon_compile.advisor``: see :mod:`muon_compile.advisor.recommend`."""

from .recommend import main

main()

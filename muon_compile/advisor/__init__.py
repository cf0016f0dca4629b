"""The cluster advisor: a distributed Muon step's predicted time for a model on a cluster,
from shapes alone, and the configuration it recommends (``python -m muon_compile.advisor``).

Nothing on the compile path imports this package. :mod:`.recommend` sweeps the settings
and recommends, :mod:`.step_cost` is the cost model over the distribute pass's plan,
:mod:`.network_profiles` prices collectives, :mod:`muon_compile.models` lists the models,
:mod:`.profiles` reads a profile file written by :mod:`.calibrate`, and :mod:`.plots`
draws the sweeps.
"""

"""The README's torchtitan recipe, as written there (tests/users/test_trainers.py builds it): an
``OptimizersContainer`` with a ``"Muon"`` factory, as a torchtitan user adds an optimizer. Its own
module, imported by the test that uses it: importing torchtitan takes seconds."""

import dataclasses

import muon_compile
from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig

__all__ = ["MuonOptimizersContainer", "ParamGroupConfig"]


class MuonOptimizersContainer(OptimizersContainer):
    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(OptimizersContainer.Config):
        pass

    @staticmethod
    def _resolve_optimizer_factory(name):
        if name == "Muon":
            return lambda param_groups, **kw: muon_compile.compile_step(muon_compile.Muon(param_groups, **kw))
        return OptimizersContainer._resolve_optimizer_factory(name)

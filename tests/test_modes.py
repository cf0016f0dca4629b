"""Every mode a setting takes is one Mode enum with its validator derived from it
(muon_compile/modes.py): the optimizers' adjust_lr, the NS algorithm, the lowering policies,
the distribution strategy and the tensor-parallel mode."""

import re

import pytest

from muon_compile import config
from muon_compile.modes import Mode
from muon_compile.ns.args import Algorithm, check_algorithm
from muon_compile.ns.cost import Policy
from muon_compile.optim.updates import AdjustLR, lr_ratio

MODES = [Algorithm, Policy, AdjustLR, config.Strategy, config.TPMode]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.__name__)
def test_a_mode_checks_its_own_values_and_names_the_setting(mode):
    assert issubclass(mode, Mode)
    for member in mode:
        assert member == member.value and str(member) == member.value and f"{member}" == member.value
        assert mode.check(member.value, "x") == member.value and type(mode.check(member, "x")) is str
    with pytest.raises(ValueError, match="^" + re.escape(f"SETTING must be one of {mode.values()}, got 'nope'") + "$"):
        mode.check("nope", "SETTING")


def test_every_adjust_lr_mode_has_its_ratio():
    assert [lr_ratio(8, 2, m) for m in AdjustLR.values()] == [2.0, pytest.approx(0.2 * 8**0.5), pytest.approx(8**0.5), 1.0]
    with pytest.raises(ValueError, match="adjust_lr must be one of"):
        lr_ratio(8, 2, "sqrt")
    assert check_algorithm("gram") == "gram"

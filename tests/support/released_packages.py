"""Muon as released on PyPI, built as each package documents it (each pinned in pyproject.toml's
``test`` extra): what tests/users/test_released.py compiles and scripts/bench_corpus.py times.

NVIDIA Emerging-Optimizers (Megatron-LM's Muon) declares Python 3.12 for ``typing.override``
alone, a decorator that marks a method and does nothing else at run time: on Python 3.11
scripts/env.sh installs it with ``--ignore-requires-python`` and :func:`_emerging` gives
``typing`` the same decorator from ``typing_extensions`` before importing it, as the benchmarks'
peer arm does (``scripts/bench_common.py``, ``python_312_typing``)."""

import contextlib
import sys
from pathlib import Path
from typing import NamedTuple

import torch


def _keller(params):
    from muon import SingleDeviceMuon  # KellerJordan/Muon as muon-optimizer

    return SingleDeviceMuon(params, lr=0.02, weight_decay=0.01)


def _heavyball(params):
    import heavyball

    return heavyball.Muon(params, lr=0.02)


@contextlib.contextmanager
def _heavyball_uncompiled():
    """HeavyBall's own code run as written: by default it compiles its fused functions itself
    (``heavyball.utils.compile_mode``, ``"max-autotune-no-cudagraphs"``: on this CPU 20 s of
    Inductor's autotuning for the eager step, 11 more for the exact one, 2026-12-07); ``None``
    is its documented switch to run them eagerly."""
    import heavyball.utils

    before = heavyball.utils.compile_mode
    heavyball.utils.compile_mode = None
    try:
        yield
    finally:
        heavyball.utils.compile_mode = before


def _pytorch_optimizer(foreach):
    def make(params):
        from pytorch_optimizer import Muon

        return Muon([dict(params=params, lr=0.02, weight_decay=0.01, use_muon=True)], foreach=foreach)
    return make


def _emerging(params):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import bench_common

    bench_common.python_312_typing()
    from emerging_optimizers.orthogonalized_optimizers import Muon  # NVIDIA Emerging-Optimizers

    return Muon(params, lr=0.02)  # its defaults: fp32_matmul_prec="medium" (bf16 NS), quintic, spectral scale


def _adam_atan2(params):
    from adam_atan2_pytorch import MuonAdamAtan2

    return MuonAdamAtan2(muon_params=params, params=params, lr=1e-3, muon_lr=0.02)


class Released(NamedTuple):
    make: object  # the optimizer, built from a parameter list as the package documents it
    dtype: torch.dtype  # its Newton–Schulz dtype
    # of one compiled step of tests/users/test_released.py's four matrices (two of one shape):
    graphs: int  # Dynamo graphs
    matched: int  # Newton–Schulz loops recognised
    buckets: int
    exact_params: torch.dtype = torch.float64  # the exact evaluation's parameters
    stacks: bool = False  # one loop per stack of same-shape matrices (else one per matrix)
    # the context of the eager and the exact references: the package's code run eagerly (the step
    # compiled with this backend runs as released)
    uncompiled: object = contextlib.nullcontext


# HeavyBall's step is split: Dynamo observes the KeyError its ``state_`` raises
# (heavyball/utils.py:1608) and runs the step eagerly around the chain it compiles, whose loops
# are recognised and bucketed together in one graph. pytorch-optimizer's default (foreach) stacks
# the two same-shape matrices into one 3-D loop (3 loops for 4 matrices), whose out= buffers
# alternate with a no-op ``flatten(0, -3)`` view of the normalised input. Emerging-Optimizers
# logs ``absl.logging.log_first_n`` and reads the matmul precision inside its Newton–Schulz
# function, and refuses an input that is not fp32: its exact evaluation keeps fp32 parameters and
# makes its bf16 cast fp64.
RELEASED = {
    "muon-optimizer SingleDeviceMuon": Released(_keller, torch.bfloat16, 1, 4, 3),
    "heavyball Muon": Released(_heavyball, torch.bfloat16, 2, 4, 3, uncompiled=_heavyball_uncompiled),
    "pytorch-optimizer Muon foreach=False": Released(_pytorch_optimizer(False), torch.bfloat16, 1, 4, 3),
    "pytorch-optimizer Muon (foreach, its default)": Released(_pytorch_optimizer(None), torch.bfloat16, 1, 3, 3, stacks=True),
    "adam-atan2-pytorch MuonAdamAtan2": Released(_adam_atan2, torch.float32, 1, 4, 3),
    "emerging-optimizers Muon": Released(_emerging, torch.bfloat16, 1, 4, 3, exact_params=torch.float32),
}



"""Muon as released on PyPI, compiled with this backend (issue 77, item 1): each package pinned in
pyproject.toml's ``test`` extra, its optimizer built as its documentation says, stepped once eagerly (its state
made) and once by ``torch.compile(opt.step, backend="muon")``. Asserted: Dynamo's graphs and graph breaks, every
Newton–Schulz loop recognised (``canonicalize.matched``: one per matrix, or per stack where the
package stacks same-shape matrices itself), the step bucketed, and the result as accurate as
eager's (tests/numerics.py: a rewritten bf16 loop against the exact evaluation of the same code,
the package's bf16 casts made fp64 by :func:`numerics.exact_step`; an fp32 loop against eager).

NVIDIA Emerging-Optimizers (Megatron-LM's Muon) declares Python 3.12 for ``typing.override``
alone, a decorator that marks a method and does nothing else at run time: on Python 3.11
scripts/env.sh installs it with ``--ignore-requires-python`` and :func:`_emerging` gives
``typing`` the same decorator from ``typing_extensions`` before importing it, as the benchmarks'
peer arm does (``scripts/bench_common.py``, ``python_312_typing``).

Not here: timm (its ``timm.layers`` imports torchvision, whose PyPI wheels are CUDA builds that
fail to load against the CPU build of torch: ``operator torchvision::nms does not exist``),
Dion (not on PyPI: tests/published/dion_generator.py)."""

import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

import muon_compile
from torch._dynamo.utils import counters as dynamo_counters

from helpers import make_params, set_grads
from numerics import assert_rewrite_close, exact_step

SHAPES = [(32, 16), (32, 16), (16, 48), (24, 24)]


def _keller(params):
    from muon import SingleDeviceMuon  # KellerJordan/Muon as muon-optimizer

    return SingleDeviceMuon(params, lr=0.02, weight_decay=0.01)


def _heavyball(params):
    import heavyball

    return heavyball.Muon(params, lr=0.02)


def _pytorch_optimizer(foreach):
    def make(params):
        from pytorch_optimizer import Muon

        return Muon([dict(params=params, lr=0.02, weight_decay=0.01, use_muon=True)], foreach=foreach)
    return make


def _emerging(params):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
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
    graphs: int  # Dynamo graphs of the compiled step
    matched: int  # Newton–Schulz loops recognised
    buckets: int
    exact_params: torch.dtype = torch.float64  # the exact evaluation's parameters


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
    "heavyball Muon": Released(_heavyball, torch.bfloat16, 2, 4, 3),
    "pytorch-optimizer Muon foreach=False": Released(_pytorch_optimizer(False), torch.bfloat16, 1, 4, 3),
    "pytorch-optimizer Muon (foreach, its default)": Released(_pytorch_optimizer(None), torch.bfloat16, 1, 3, 3),
    "adam-atan2-pytorch MuonAdamAtan2": Released(_adam_atan2, torch.float32, 1, 4, 3),
    "emerging-optimizers Muon": Released(_emerging, torch.bfloat16, 1, 4, 3, exact_params=torch.float32),
}


def _run(make, compiled, exact=None):
    """Parameters after two steps: the first eager (it makes the optimizer's state), the second
    compiled (the step a training run repeats) or eager; ``exact``: the parameters' dtype of the
    exact evaluation."""
    params = make_params(SHAPES, dtype=exact or torch.float32)
    opt = make(params)
    steps = [opt.step, torch.compile(opt.step, backend="muon") if compiled else opt.step]
    for seed, step in enumerate(steps):
        set_grads(params, seed)
        (exact_step(step) if exact else step)()
    return [p.detach() for p in params]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RELEASED))
def test_released_muon_is_recognised_bucketed_and_as_accurate_as_eager(name):
    make, dtype, graphs, matched, buckets, exact_params = RELEASED[name]
    eager = _run(make, compiled=False)
    exact = _run(make, compiled=False, exact=exact_params)
    dynamo_counters.clear()
    got = _run(make, compiled=True)
    assert dynamo_counters["stats"]["unique_graphs"] == graphs, dict(dynamo_counters["stats"])
    assert sum(dynamo_counters["graph_break"].values()) == 0, dict(dynamo_counters["graph_break"])
    assert muon_compile.counters["canonicalize.matched"] == matched, dict(muon_compile.counters)
    assert muon_compile.counters["bucket.buckets"] == buckets, dict(muon_compile.counters)
    start = make_params(SHAPES)
    for i, (g, e, x, s) in enumerate(zip(got, eager, exact, start)):
        assert_rewrite_close(g - s, e - s, x.float() - s, dtype, f"{name} matrix {i} {SHAPES[i]}")

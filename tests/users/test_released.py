"""Muon as released on PyPI, compiled with this backend (issue 77, item 1): each package pinned in
pyproject.toml's ``test`` extra, its optimizer built as its documentation says, stepped once eagerly (its state
made) and once by ``torch.compile(opt.step, backend="muon")``. Asserted: Dynamo's graphs and graph breaks, every
Newton–Schulz loop recognised (``canonicalize.matched``: one per matrix, or per stack where the
package stacks same-shape matrices itself), the step bucketed, and the result as accurate as
eager's (tests/support/numerics.py: a rewritten bf16 loop against the exact evaluation of the same code,
the package's bf16 casts made fp64 by :func:`numerics.exact_step`; an fp32 loop against eager).
The eager steps run the package's code as written: HeavyBall compiles its own functions by default (inside
this backend's compile it runs them as written), which they switch off (``Released.uncompiled``).

The packages and how each is built: tests/support/released_packages.py.

Not here: timm (its ``timm.layers`` imports torchvision, whose PyPI wheels are CUDA builds that
fail to load against the CPU build of torch: ``operator torchvision::nms does not exist``),
Dion (not on PyPI: tests/support/published/dion_generator.py)."""

import contextlib

import pytest
import torch

import muon_compile
from torch._dynamo.utils import counters as dynamo_counters

from helpers import make_params, set_grads
from numerics import assert_rewrite_close, exact_step
from released_packages import RELEASED

SHAPES = [(32, 16), (32, 16), (16, 48), (24, 24)]


def _run(make, compiled, exact=None, uncompiled=contextlib.nullcontext):
    """Parameters after two steps: the first eager (it makes the optimizer's state), the second
    compiled (the step a training run repeats) or eager; ``exact``: the parameters' dtype of the
    exact evaluation. The eager steps run under ``uncompiled`` (the package's code as written)."""
    params = make_params(SHAPES, dtype=exact or torch.float32)
    opt = make(params)
    steps = [opt.step, torch.compile(opt.step, backend="muon") if compiled else opt.step]
    for seed, step in enumerate(steps):
        set_grads(params, seed)
        dynamo_counters.clear()  # the graphs counted are the second step's
        with contextlib.nullcontext() if compiled and seed else uncompiled():
            (exact_step(step) if exact else step)()
    return [p.detach() for p in params]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RELEASED))
def test_released_muon_is_recognised_bucketed_and_as_accurate_as_eager(name):
    make, dtype, graphs, matched, buckets, exact_params, _, uncompiled = RELEASED[name]
    eager = _run(make, compiled=False, uncompiled=uncompiled)
    exact = _run(make, compiled=False, exact=exact_params, uncompiled=uncompiled)
    got = _run(make, compiled=True, uncompiled=uncompiled)
    assert dynamo_counters["stats"]["unique_graphs"] == graphs, dict(dynamo_counters["stats"])
    assert sum(dynamo_counters["graph_break"].values()) == 0, dict(dynamo_counters["graph_break"])
    assert muon_compile.counters["canonicalize.matched"] == matched, dict(muon_compile.counters)
    assert muon_compile.counters["bucket.buckets"] == buckets, dict(muon_compile.counters)
    start = make_params(SHAPES)
    for i, (g, e, x, s) in enumerate(zip(got, eager, exact, start)):
        assert_rewrite_close(g - s, e - s, x.float() - s, dtype, f"{name} matrix {i} {SHAPES[i]}")

"""The ``stack_writes`` pass on the write forms of public per-parameter Muons (its golden graph
and unmodified ``torch.optim.Muon``: tests/passes/test_golden.py; the kernel running its writes under
Triton's interpreter: tests/support/scale_add_cases.py). The pass plans only where the stacked write
runs in one pass (CUDA), so here it is made to, the op's CPU fallback computing the same; each
compiled step is checked against eager and the exact (fp64) step."""

import dataclasses
import functools

import pytest
import torch

import muon_compile
from muon_compile.optim import stacks
from muon_compile.compile.compat import DYNAMO_ROUNDS_ALPHA_PRODUCTS
from muon_compile.passes.writes import stack_writes

from helpers import graph_caches_off, make_params
from muon_corpus import CORPUS, LR, torch_optim_muon
from numerics import assert_rewrite_close
from muon_corpus import run_entry

SHAPES = [(48, 16), (16, 48)] * 4  # one bucket, the orientations alternating: a run of 4 (stride 2) each

# torch 2.11's Dynamo traces add_(u, alpha=a) as add_(u * a), the product rounded to u's dtype: a
# number a is the write's src_scale, but a tensor one (a tensor lr) stays per parameter there
LATER = 0 if DYNAMO_ROUNDS_ALPHA_PRODUCTS else 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "stacked"),
    [
        ("torch_tensor_lr", 8 * LATER),  # add_(u, alpha=-lr) with a tensor lr: prims.fma(u, -lr, p * (1 - lr * wd))
        ("modded_nanogpt", 8),  # its own stacks, unbind-ed; p.sub_(lr * scale * u.to(p.dtype)), lr a tensor
        ("keller_muon", 8),  # the tall members' u *= scale in bf16 after the slice: the write's src_scale
    ],
)
def test_public_write_forms_are_stacked(name, stacked, monkeypatch):
    monkeypatch.setattr(stacks, "writes_in_one_pass", lambda *args: True)
    if name == "torch_tensor_lr":
        tensor_lr = functools.partial(torch_optim_muon, lr=torch.tensor(LR))
        entry = dataclasses.replace(CORPUS["torch_optim_muon"], name=name, make=tensor_lr)
    else:
        entry = CORPUS[name]
    start = [p.detach() for p in make_params(SHAPES)]
    with graph_caches_off():
        got = run_entry(entry, SHAPES, backend="muon", steps=1)
    assert muon_compile.counters["stack_writes.members"] == stacked
    assert muon_compile.counters["stack_writes.writes"] == stacked // 4  # one per orientation, 4 members each
    eager = run_entry(entry, SHAPES, steps=1)
    exact = run_entry(entry, SHAPES, dtype=torch.float64, steps=1)
    for i, (g, e, x, s) in enumerate(zip(got, eager, exact, start)):
        assert_rewrite_close(g - s, e - s, x - s, entry.dtype, f"{name} param {i} {SHAPES[i]}")


def test_members_split_into_runs_of_equal_stride():
    """A group's members, by their matrix in the bucket, become runs of one stride (two or
    more members each, so one strided view serves a run); a matrix written into two
    parameters starts a new run (a stride of 0 is no view)."""
    from types import SimpleNamespace

    def runs(indices):
        return [[m.index for m in w.members] for w in stack_writes._runs([SimpleNamespace(index=i) for i in indices])]

    assert runs([0, 2, 4, 5, 6, 7]) == [[0, 2, 4], [5, 6, 7]]
    assert runs([1, 3, 4]) == [[1, 3]]
    assert runs([0, 1, 1, 2]) == [[0, 1], [1, 2]]
    assert runs([3]) == []

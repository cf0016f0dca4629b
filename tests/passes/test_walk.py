"""canonicalize's walk (muon_compile/passes/canonicalize/walk.py, with nodes.py, values.py and
rules.py) on Dynamo graphs captured without compiling: the candidate loops it returns as plain
data, before the matcher's verdict (test_canonicalize.py compiles what it matches)."""

import pytest
import torch

from muon_compile.passes.canonicalize import rules
from muon_compile.passes.canonicalize.nodes import node_kind
from muon_compile.passes.canonicalize.values import View
from muon_compile.passes.canonicalize.walk import walk_graph

import ns_forms
from helpers import GraphCapture


def capture(fn, *args):
    """Dynamo's graph of ``fn(*args)`` and its placeholders' real values."""
    capture = GraphCapture()
    torch._dynamo.reset()
    torch.compile(fn, backend=capture, fullgraph=True)(*args)
    gm = capture.only
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return gm, dict(zip(placeholders, capture.inputs[0]))


def scaled_with_eps_input(G, eps, s):
    """An eps kept as a tensor (folded at its compile-time value) and a scale of the result
    (a tensor too, but no constant of the loop)."""
    X = G / (G.norm() + eps)
    for _ in range(3):
        A = X @ X.mT
        X = ns_forms.KELLER[0] * X + (ns_forms.KELLER[1] * A + ns_forms.KELLER[2] * A @ A) @ X
    return X * s


def test_a_textbook_loop_is_one_chain_with_its_steps():
    """Keller's five iterations: the division starts the chain, four steps are finished (the
    fifth is read off the escape by the matcher), in bf16, the walk's lists made tuples."""
    gm, values = capture(ns_forms.keller, torch.randn(8, 12))
    before = str(gm.graph)
    (chain,) = walk_graph(gm.graph, values)
    assert str(gm.graph) == before  # the walk changes nothing
    assert chain.reason is None and chain.iterates and not chain.gram
    assert chain.steps == (ns_forms.KELLER,) * 4
    assert chain.dtype == torch.bfloat16 and chain.norm.eps == pytest.approx(1e-7) and not chain.norm.clamp
    assert node_kind(chain.start) == ("div", False)
    assert len(chain.escapes) == 1 and chain.escapes[0].user.op == "output"
    assert all(isinstance(f, tuple) for f in (chain.steps, chain.members, chain.escapes, chain.fixed, chain.restarts))


def test_per_iteration_coefficients_are_each_step_and_the_safety_factor_scales_the_norm():
    """nanochat's Polar Express on a tall matrix (products from the right): each iteration's
    own step, the norm times 1.01."""
    gm, values = capture(ns_forms.polar_express, torch.randn(12, 8))
    (chain,) = walk_graph(gm.graph, values)
    assert chain.reason is None
    assert chain.steps == tuple(tuple(abc) for abc in ns_forms.POLAR[:4])
    assert chain.norm.scale == ns_forms.POLAR_SAFETY


@pytest.mark.parametrize(
    "form, shape, reason",
    [
        ("spectral_norm", (8, 12), "linalg_matrix_norm is the ord=2 norm, not the Frobenius norm"),
        ("foreign_norm", (8, 12), "X_1 divides by the norm of another tensor"),
        ("whole_stack_norm", (2, 8, 12), "norm reduces dims [0, 1, 2] of a 3-D tensor, not each matrix"),
    ],
)
def test_a_chain_the_walk_rejects_says_why(form, shape, reason):
    gm, values = capture(getattr(ns_forms, form), torch.randn(shape))
    (chain,) = walk_graph(gm.graph, values)
    assert chain.iterates and chain.reason == reason


def test_an_intermediate_read_is_an_escape_the_matcher_judges():
    """The walk records both reads of the loop (the result and an intermediate) without a
    verdict: deciding which escapes are the result is the matcher's."""
    gm, values = capture(ns_forms.leaks_intermediate, torch.randn(8, 12))
    (chain,) = walk_graph(gm.graph, values)
    assert chain.reason is None and len(chain.escapes) == 2
    assert len({e.value for e in chain.escapes}) == 2


def test_an_input_constant_of_the_loop_is_fixed_and_a_scale_of_its_result_is_not():
    gm, values = capture(scaled_with_eps_input, torch.randn(8, 12), torch.tensor(1e-7), torch.tensor(0.5))
    (chain,) = walk_graph(gm.graph, values)
    assert chain.reason is None
    assert [(n.name, v.item()) for n, v in chain.fixed] == [("l_eps_", pytest.approx(1e-7))]
    assert chain.norm.eps == pytest.approx(1e-7) and [n.name for n in chain.norm.inputs] == ["l_eps_"]
    # without the inputs' values the eps is data: no norm, no chain
    assert walk_graph(gm.graph) == []


def test_rules_read_a_transpose_as_a_view_and_only_the_last_two_dims():
    def f(x):
        return x.mT + 0, x.transpose(0, 1) + 0, x.transpose(-1, -2) + 0

    gm, _ = capture(f, torch.randn(2, 4, 6))
    views = [n for n in gm.graph.nodes if node_kind(n)[0] in rules.TRANSPOSES]
    read = [rules.transpose(n, node_kind(n)[0]) for n in views]
    source = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert read == [View(source, True), None, View(source, True)]

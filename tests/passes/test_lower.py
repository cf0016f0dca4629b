"""The lower pass on its own (muon_compile/passes/lower/): the plan of each NS op node as plain
data (the algorithm requested, set or chosen by cost; a symbolic shape left to the op; the
report), and the apply on a graph traced without compiling, against the op it replaces. The
epilogue form each device's table picks is test_ns_algorithms.py's."""

import dataclasses

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from muon_compile.ns.args import GRAM, TEXTBOOK
from muon_compile.ns.op import NEWTON_SCHULZ
from muon_compile.passes.find import find_ns_sites
from muon_compile.passes.lower.apply import lower_ns_ops
from muon_compile.passes.lower.plan import plan_algorithms

from helpers import keller_args, ns_site
from numerics import FP32_RTOL, NS_RTOL, assert_rel_close


def nodes(n):
    """Graph nodes standing for ``n`` NS op nodes: the plan reads their names only."""
    graph = fx.Graph()
    return [graph.placeholder(f"ns{i}") for i in range(n)]


def test_a_requested_algorithm_is_kept_and_auto_follows_the_policy_then_the_cost():
    sites = [
        ns_site(0, 384, 1536, batch=12, args=dataclasses.replace(keller_args(), algorithm=TEXTBOOK)),
        ns_site(1, 384, 1536, batch=12),
        ns_site(2, 384, 1536, batch=12, device="cuda"),
    ]
    by_cost = plan_algorithms(nodes(3), sites, policy="auto").choices
    assert [(c.choice.algorithm, c.choice.reason) for c in by_cost[:1]] == [(TEXTBOOK, "requested by the call")]
    # the module docstring's example: bf16 12 x 384x1536 is textbook on this CPU, gram on CUDA
    assert [c.choice.algorithm for c in by_cost] == [TEXTBOOK, TEXTBOOK, GRAM]
    assert by_cost[2].choice.reason.startswith("predicted Gram/textbook time")
    forced = plan_algorithms(nodes(3), sites, policy=GRAM).choices
    assert [(c.choice.algorithm, c.choice.reason) for c in forced] == [
        (TEXTBOOK, "requested by the call"),
        (GRAM, "MUON_COMPILE_NS_ALGORITHM=gram"),
        (GRAM, "MUON_COMPILE_NS_ALGORITHM=gram"),
    ]


def test_flops_count_each_algorithm_per_matrix():
    """``20 m^2 n + 10 m^3`` a textbook matrix for five steps (m <= n), ``8 m^2 n + 28 m^3``
    by the Gram matrix (one restart-free run), times the node's batch."""
    m, n = 384, 1536
    plan = plan_algorithms(nodes(1), [ns_site(0, n, m, batch=12)], policy="auto")  # tall: m is the short side
    assert plan.flops(TEXTBOOK) == 12 * (20 * m * m * n + 10 * m**3)
    assert plan.flops(GRAM) == 12 * (8 * m * m * n + 28 * m**3)
    assert plan.flops() == plan.flops(plan.choices[0].choice.algorithm)


def test_a_symbolic_shape_is_left_to_the_op_and_reported():
    sites = [ns_site(0, -1, 64, skip="its shape is symbolic"), ns_site(1, 64, 64)]
    plan = plan_algorithms(nodes(2), sites, policy="auto")
    assert [c.node for c in plan.choices] == ["ns1"] and plan.skipped == (("ns0", "its shape is symbolic"),)
    lines = plan.describe().splitlines()
    assert lines[0].startswith("ns ns1: 1 x 64x64 torch.bfloat16: textbook (")
    assert lines[1] == "ns ns0: left as the op (its shape is symbolic)"
    assert lines[2].startswith("NS GFLOP per step: chosen ")


@pytest.mark.parametrize("policy", [TEXTBOOK, GRAM])
def test_lowering_replaces_each_op_by_its_kernel(policy):
    """A traced graph of two NS op nodes (a 3-D batch and a tall matrix, fp32) lowered with
    either algorithm: no op left, each result within fp32's NS bound of the op's own."""
    args = keller_args(torch.float32)

    def two_calls(x, y):
        return NEWTON_SCHULZ(x, *args.to_op()), NEWTON_SCHULZ(y, *args.to_op())

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 8, 24, generator=g), torch.randn(40, 12, generator=g)
    gm = make_fx(two_calls, tracing_mode="fake")(x, y)
    ns_nodes, sites = find_ns_sites(gm.graph)
    assert [(s.batch, s.rows, s.cols) for s in sites] == [(3, 8, 24), (1, 40, 12)]
    plan = plan_algorithms(ns_nodes, sites, policy=policy)
    lower_ns_ops(gm.graph, plan)
    gm.graph.lint()
    gm.recompile()
    assert not [n for n in gm.graph.nodes if n.target is NEWTON_SCHULZ]
    assert any(n.target is torch.ops.aten.bmm.default for n in gm.graph.nodes)
    for got, want in zip(gm(x, y), two_calls(x, y)):
        assert got.shape == want.shape
        rtol = NS_RTOL["cpu"][torch.float32] if policy == GRAM else FP32_RTOL
        assert_rel_close(got, want, rtol)

"""The writes passes on their own (muon_compile/passes/writes/): ``stack_writes``' plan of member
writes and its stacked write, ``write_source``'s swap of the write's source, on aten graphs traced
without compiling, each run against the graph it rewrote. test_stack_writes.py compiles the
public write forms."""

import pytest
import torch
from torch._higher_order_ops.auto_functionalize import auto_functionalized_v2
from torch.fx.experimental.proxy_tensor import make_fx

from muon_compile.optim import stacks
from muon_compile.optim.stacks import STACK_WRITE
from muon_compile.passes.writes.stack_writes import apply_stack_writes, plan_stack_writes
from muon_compile.passes.writes.write_source import apply_write_sources, exact_cast_up, plan_write_sources

aten = torch.ops.aten


def trace(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def run(gm, fn, args, params):
    """Parameters after the rewritten graph and after ``fn`` itself, from the same start."""
    mine, theirs = [p.clone() for p in params], [p.clone() for p in params]
    gm.graph.lint()
    gm.recompile()
    gm(*mine, *args)
    fn(*theirs, *args)
    return mine, theirs


def bucket_writes(decays):
    """A bucket's result ``B`` (its NS output cast up to the parameters' fp32) written into one
    parameter per matrix, ``p * decay + B[i] * -0.03`` as ``torch.optim.Muon`` spells it."""

    def step(*args):
        *params, x = args
        result = (x * 2).to(torch.float32).clone()
        for i, (p, decay) in enumerate(zip(params, decays)):
            p.copy_(torch.add(p * decay, result[i], alpha=-0.03))

    return step


@pytest.fixture
def one_pass(monkeypatch):
    """The stacked write as on CUDA, where it runs in one pass (on this CPU its fallback)."""
    monkeypatch.setattr(stacks, "writes_in_one_pass", lambda *args: True)


def test_member_writes_of_one_bucket_become_one_stacked_write(one_pass):
    step = bucket_writes([0.998] * 3)
    params, x = [torch.randn(8, 4) for _ in range(3)], torch.randn(3, 8, 4, dtype=torch.bfloat16)
    gm = trace(step, *params, x)
    (write,) = plan_stack_writes(gm.graph)
    assert [(m.index, m.scale, m.alpha, m.transposed) for m in write.members] == [(i, 0.998, -0.03, False) for i in range(3)]
    apply_stack_writes(gm.graph, [write])
    (node,) = gm.graph.find_nodes(op="call_function", target=auto_functionalized_v2)
    assert node.args[0] is STACK_WRITE and node.kwargs["_dsts_length"] == 3
    assert not gm.graph.find_nodes(op="call_function", target=aten.add.Tensor)  # the members' arithmetic is gone
    mine, theirs = run(gm, step, [x], params)
    # the op's CPU fallback makes each member's two calls (times the scale, add with alpha) itself
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs))


def test_another_factor_or_a_gap_splits_the_run():
    """Members 0, 1 and 3 decayed alike (3 after a gap in stride), member 2 otherwise: one run of 0 and 1."""
    step = bucket_writes([0.998, 0.998, 0.9, 0.998])
    params, x = [torch.randn(8, 4) for _ in range(4)], torch.randn(4, 8, 4, dtype=torch.bfloat16)
    gm = trace(step, *params, x)
    assert plan_stack_writes(gm.graph) == []  # this CPU: the write is two passes, each member's fuses in one
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stacks, "writes_in_one_pass", lambda *args: True)
        (write,) = plan_stack_writes(gm.graph)
    assert [m.index for m in write.members] == [0, 1]


def source_swap_step(p0, p1, x, scale, alpha):
    """The stacked write of a transposed bf16 result, cast up to fp32 and made contiguous
    first, as ``lower`` leaves the stacked optimizer's write."""
    src = torch.ops.prims.convert_element_type(x.permute(0, 2, 1), torch.float32).clone()
    out = auto_functionalized_v2(
        STACK_WRITE, scale=scale, src=src, alpha=alpha, cautious=False, src_scale=1.0,
        _dsts_length=2, _all_bases=[p0, p1], _dsts_0_base_index=0, _dsts_1_base_index=1,
    )  # fmt: skip
    p0.copy_(out[1])
    p1.copy_(out[2])


def test_the_write_reads_the_result_before_its_exact_cast_and_copy():
    params, x = [torch.randn(8, 4) for _ in range(2)], torch.randn(2, 4, 8, dtype=torch.bfloat16)
    factors = [torch.tensor(0.998, dtype=torch.float64), torch.tensor(-0.03, dtype=torch.float64)]
    gm = trace(source_swap_step, *params, x, *factors)
    (swap,) = plan_write_sources(gm.graph)
    assert swap.source.target is aten.permute.default
    assert [n.target for n in swap.skipped] == [aten.clone.default, torch.ops.prims.convert_element_type.default]
    apply_write_sources(gm.graph, [swap])
    assert swap.node.kwargs["src"] is swap.source
    assert not gm.graph.find_nodes(op="call_function", target=aten.clone.default)
    mine, theirs = run(gm, source_swap_step, [x, *factors], params)
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs))  # the cast up is exact, the copy only lays out


def test_only_an_exact_cast_up_is_skipped():
    assert exact_cast_up(torch.bfloat16, torch.float32) and exact_cast_up(torch.float16, torch.float32)
    assert exact_cast_up(torch.float32, torch.float64)
    assert not exact_cast_up(torch.float32, torch.bfloat16)  # rounds
    assert not exact_cast_up(torch.bfloat16, torch.float16)  # bf16's range is wider
    assert not exact_cast_up(torch.float16, torch.bfloat16)  # fp16 has more digits
    assert not exact_cast_up(torch.int32, torch.float32)

"""The stacked layout of Muon state (muon_compile.optim.stacks): which parameters stack, the
stacked step against the per-parameter one (against the fp64 textbook: test_optimizers),
state views through state_dict / load_state_dict, missing gradients, and one compiled
graph for 2,000 matrices."""

import copy

import pytest
import torch
from torch import nn

import muon_compile
from muon_compile.optim import stacks

from helpers import compare_steps, compile_with_dump, count_ns_calls, make_params, muon, set_grads
from numerics import NS_RTOL

REPEATED = [(6, 10), (10, 6), (6, 10), (8, 8), (10, 6), (6, 10)]


def test_group_stacks_groups_equal_2d_shapes_dtypes_and_devices():
    params = make_params([(4, 6), (4, 6), (6, 4), (2, 4, 6), (2, 4, 6), (4, 6), (3, 3)])
    params.append(nn.Parameter(torch.zeros(4, 6, dtype=torch.float64)))
    layout = stacks.group_stacks(params)
    assert [s.indices for s in layout.stacks] == [(0, 1, 5)]
    assert layout.loose == (2, 3, 4, 6, 7)  # singletons, 3-D batches, another dtype


def test_state_entries_are_views_of_the_stacked_buffer():
    params = make_params(REPEATED)
    opt = muon_compile.Muon(params, normuon_beta2=0.95)
    (first, second), loose = opt._stacks[0].stacks, opt._stacks[0].loose
    assert first.indices == (0, 2, 5) and second.indices == (1, 4) and loose == (3,)
    for j, i in enumerate(first.indices):
        for key in ("momentum_buffer", "second_moment"):
            view = opt.state[params[i]][key]
            assert view.untyped_storage().data_ptr() == first.state[key].untyped_storage().data_ptr()
            assert view.data_ptr() == first.state[key][j].data_ptr()
    set_grads(params, 0)
    opt.step()
    assert opt.state[params[2]]["momentum_buffer"].abs().sum() > 0  # the step wrote through the views


@pytest.mark.parametrize(
    "options",
    [
        dict(normuon_beta2=0.95, cautious_weight_decay=True),
        dict(split_rows=2, adjust_lr="spectral", extra_scale_factor=0.5),
        dict(nesterov=False, weight_decay=0.0),
    ],
    ids=["normuon-cautious", "split-rows", "plain-momentum"],
)
def test_stacked_step_matches_per_parameter_step(options):
    """One parameter per param group steps on its own (no stacks): the stacked step must
    give the same parameters and state, in fp64 to rounding."""
    kw = dict(lr=0.05, weight_decay=0.1, ns_dtype=torch.float64) | options
    a, b = make_params(REPEATED, torch.float64), make_params(REPEATED, torch.float64)
    stacked, alone = muon_compile.Muon(a, **kw), muon_compile.Muon([{"params": [q]} for q in b], **kw)
    assert stacked._stacks[0].stacks and not any(layout.stacks for layout in alone._stacks)
    for step in range(3):
        set_grads(a, step)
        set_grads(b, step)
        stacked.step()
        alone.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-12, atol=1e-12)
        for key, value in stacked.state[p].items():
            torch.testing.assert_close(value, alone.state[q][key], rtol=1e-12, atol=1e-12)


def test_load_state_dict_restacks_and_continues_like_the_original():
    a, b = make_params(REPEATED, torch.float64), make_params(REPEATED, torch.float64)
    opt_a = muon_compile.Muon(a, ns_dtype=torch.float64)
    set_grads(a, 0)
    opt_a.step()
    opt_b = muon_compile.Muon(b, ns_dtype=torch.float64)
    with torch.no_grad():
        for p, q in zip(a, b):
            q.copy_(p)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # torch.optim would alias same-device state
    stack = opt_b._stacks[0].stacks[0]
    assert opt_b.state[b[2]]["momentum_buffer"].data_ptr() == stack.state["momentum_buffer"][1].data_ptr()
    set_grads(a, 1)
    set_grads(b, 1)
    opt_a.step()
    opt_b.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=0, atol=0)


def test_a_member_without_gradient_is_left_alone_and_the_others_step():
    params, ref = make_params([(4, 6)] * 3, torch.float64), make_params([(4, 6)] * 3, torch.float64)
    before = [p.detach().clone() for p in params]
    opt = muon_compile.Muon(params, ns_dtype=torch.float64)
    ref_opt = muon_compile.Muon(ref[:2], ns_dtype=torch.float64)  # the two that have gradients, stacked
    set_grads(params, 0)
    params[1].grad = None
    with torch.no_grad():
        ref[1].copy_(params[2])
    for r, p in zip(ref[:2], (params[0], params[2])):
        r.grad = p.grad.clone()
    opt.step()
    ref_opt.step()
    assert torch.equal(params[1].detach(), before[1])
    assert opt.state[params[1]]["momentum_buffer"].abs().sum() == 0
    for got, want in ((params[0], ref[0]), (params[2], ref[1])):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.slow(seconds=40)
def test_two_thousand_matrices_compile_one_graph():
    """2,000 small matrices (four shapes) compile to one graph, and the compiled steps
    match eager (fp32 NS; see numerics.py)."""
    shapes = [(4, 4), (4, 8), (8, 4), (6, 6)] * 500
    torch._dynamo.utils.counters.clear()
    compare_steps(muon(lr=0.02, ns_dtype=torch.float32), shapes, rtol=NS_RTOL["cpu"][torch.float32])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_a_large_stack_steps_as_one_even_compiled_for_the_cpu(monkeypatch):
    """Compiled for the CPU, a stack of at most MEMBERS_APART members steps member by
    member, a larger one as one (member by member its compile grows by about 0.2 s a member:
    muon_compile/optim/stacks.py); on CUDA, and eagerly, every stack steps as one."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert stacks.steps_as_one(cpu, 2)  # eagerly
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not stacks.steps_as_one(cpu, stacks.MEMBERS_APART)
    assert stacks.steps_as_one(cpu, stacks.MEMBERS_APART + 1)
    assert stacks.steps_as_one(cuda, 2)


def test_a_large_stack_compiled_for_the_cpu_is_written_by_the_op(tmp_path):
    """Compiled for the CPU, where the write op is two foreach passes: a stack of
    MEMBERS_APART members steps and is written member by member (its NS loops bucketed by
    the backend, no op in the graph), one of MEMBERS_APART + 1 steps as one and is written by
    the op, one call for all its members; both as eager computes them."""
    apart, one = stacks.MEMBERS_APART, stacks.MEMBERS_APART + 1
    shapes = [(4, 4)] * apart + [(4, 8)] * one
    graphs, step = compile_with_dump(muon(lr=0.02, weight_decay=0.1, ns_dtype=torch.float32), shapes, tmp_path)
    assert count_ns_calls(graphs["bucket_before"]) == apart + 1  # a loop a member, one for the stack
    assert count_ns_calls(graphs["bucket_after"]) == 2  # the members' loops bucketed
    lowered = graphs["lower_after"]
    assert lowered.count("muon_compile.stack(") == 1
    writes = [line for line in lowered.splitlines() if "unstack_scale_add_" in line]
    assert len(writes) == 1 and f"_dsts_length={one}," in writes[0], writes
    step.assert_close(NS_RTOL["cpu"][torch.float32])

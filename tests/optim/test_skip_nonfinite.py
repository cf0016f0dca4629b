"""MuonAdamW(skip_nonfinite=True): a step with a NaN or inf gradient leaves every
parameter and all state exactly as they were and is counted; the run then goes on as if
the step had never been taken; eager and compiled; on FSDP2 every rank skips when one
rank's shard holds the NaN. The default is unchanged (a NaN propagates, as in eager)."""

import io

import pytest
import torch

import muon_compile

from dist_harness import run_world
from dist_workers import FSDP_SHAPES, SKIP_OPT, fsdp_skip_nonfinite, reference_run
from helpers import MIXED_SHAPES, make_params, set_grads
from numerics import NS_RTOL, assert_rel_close

SHAPES = MIXED_SHAPES[:4] + [(8,), ()]  # Muon matrices, then two AdamW tensors


def _optimizer(params, **kw):
    groups = [{"params": params[:-2], "kind": "muon"}, {"params": params[-2:], "kind": "adamw"}]
    return muon_compile.MuonAdamW(groups, lr=0.05, weight_decay=0.1, ns_dtype=torch.float32, normuon_beta2=0.95, **kw)


def _snapshot(params, opt):
    state = [v.clone() for p in params for v in opt.state[p].values()]
    return [p.detach().clone() for p in params] + state


def _run(seeds, bad_seeds=(), compiled=False, **kw):
    """Params and optimizer after a step per seed; ``bad_seeds`` put a NaN in parameter 1's gradient."""
    params = make_params(SHAPES)
    opt = _optimizer(params, **kw)
    step = torch.compile(opt.step, backend="muon") if compiled else opt.step
    for seed in seeds:
        set_grads(params, seed)
        if seed in bad_seeds:
            params[1].grad[0, 0] = float("nan")
        step()
    return params, opt


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_nonfinite_step_changes_nothing(bad):
    params, opt = _run([1], skip_nonfinite=True)
    before = _snapshot(params, opt)
    set_grads(params, 2)
    params[-2].grad[3] = bad  # an AdamW gradient: the Muon matrices must skip too
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(_snapshot(params, opt), before))
    assert opt.skipped_steps.item() == 1
    assert [g["skipped_steps"].item() for g in opt.param_groups] == [1, 1]


def test_run_after_a_skipped_step_is_the_run_without_it():
    """Bitwise, eager: the gates are exact (lr * 1, beta where live), so a run that skipped
    step 2 equals a run that never saw it; and it equals the run without skip_nonfinite."""
    skipped, opt = _run([1, 2, 3], bad_seeds=(2,), skip_nonfinite=True)
    plain, _ = _run([1, 3])
    assert all(torch.equal(a, b) for a, b in zip(skipped, plain))
    assert opt.skipped_steps.item() == 1


def test_skipped_first_step_keeps_adamw_finite():
    """Skipped at step 0 AdamW's bias correction would divide by 0; the next step is then
    exactly a first step."""
    skipped, _ = _run([2, 3], bad_seeds=(2,), skip_nonfinite=True)
    plain, _ = _run([3])
    assert all(torch.equal(a, b) for a, b in zip(skipped, plain))


def test_default_lets_a_nan_through():
    params, _ = _run([1, 2], bad_seeds=(2,))
    assert torch.isnan(params[1]).any()


def test_skipped_steps_survive_a_state_dict_round_trip():
    _, opt = _run([1, 2], bad_seeds=(2,), skip_nonfinite=True)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    fresh = _optimizer(make_params(SHAPES), skip_nonfinite=True)
    fresh.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
    assert fresh.skipped_steps.item() == 1
    from_plain = _optimizer(make_params(SHAPES), skip_nonfinite=True)
    from_plain.load_state_dict(_run([1])[1].state_dict())
    assert from_plain.skipped_steps.item() == 0
    with pytest.raises(ValueError, match="skip_nonfinite=True"):
        _run([1])[1].skipped_steps


@pytest.mark.slow
def test_compiled_skip_matches_eager():
    """Compiled: the skipped step leaves everything bitwise as it was; the run matches the
    eager one (fp32 Newton–Schulz tolerance, numerics.py) with one graph for both kinds of step."""
    from torch._dynamo.utils import counters

    counters.clear()
    params, opt = _run([1], compiled=True, skip_nonfinite=True)
    step = torch.compile(opt.step, backend="muon")
    before = _snapshot(params, opt)
    set_grads(params, 2)
    params[1].grad[0, 0] = float("nan")
    step()
    assert all(torch.equal(a, b) for a, b in zip(_snapshot(params, opt), before))
    set_grads(params, 3)
    step()
    eager, _ = _run([1, 2, 3], bad_seeds=(2,), skip_nonfinite=True)
    start = make_params(SHAPES)
    for i, (c, e, s) in enumerate(zip(params, eager, start)):
        assert_rel_close(c.detach() - s, e.detach() - s, NS_RTOL["cpu"][torch.float32], f"param {i}")
    assert opt.skipped_steps.item() == 1
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.distributed
@pytest.mark.slow
def test_fsdp2_every_rank_skips_when_one_shard_is_nonfinite():
    """World 2: the NaN sits in rows only rank 1 holds; both ranks skip (one scalar
    all-reduce), count it, and end where a one-process run without that step ends."""
    results = run_world(fsdp_skip_nonfinite, 2, timeout=600)
    reference = reference_run(FSDP_SHAPES, (0, 2), **SKIP_OPT)  # plain Muon without step 1
    for rank, (weights, skipped) in enumerate(results):
        assert skipped == 1, rank
        for i, (w, r) in enumerate(zip(weights, reference)):
            assert_rel_close(w, r, NS_RTOL["cpu"][torch.float32], f"rank {rank} weight {i}")

"""``muon_compile.compile_step(opt)`` (issue 76): ``opt.step`` becomes the compiled step and stays
what ``torch.optim`` expects of it (muon_compile/compile/compile_step.py). Every compiled step here is
compared with the same optimizer stepped eagerly, within the bf16 Newton–Schulz bound."""

import copy
import pickle
import warnings

import pytest
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR

import muon_compile
from muon_compile import compile_step, uncompile_step

from helpers import dynamo_frames, make_params, set_grads
from numerics import NS_RTOL, assert_rel_close

SHAPES = [(8, 24), (8, 24), (16, 8)]
RTOL = NS_RTOL["cpu"][torch.bfloat16]


def _run(make_opt, compiled: bool, steps: int = 3, before=None, after=None):
    """Parameters after ``steps`` steps of ``make_opt(params)`` with the schedulers
    ``before(opt)`` (built before compile_step) and ``after(opt)`` (after), each stepped
    after the optimizer; the optimizer too."""
    params = make_params(SHAPES)
    opt = make_opt(params)
    schedulers = [before(opt)] if before else []
    if compiled:
        compile_step(opt)
    if after:
        schedulers.append(after(opt))
    for seed in range(steps):
        set_grads(params, seed)
        opt.step()
        for s in schedulers:
            s.step()
    return params, opt


def _assert_same(got, want):
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=RTOL, atol=1e-3)


def test_schedulers_before_and_after_see_a_bound_method_and_the_step_compiles_once():
    """The issue's crash (``'function' object has no attribute '__func__'`` in
    ``lr_scheduler``) came from assigning a compiled function to ``opt.step``; with
    compile_step a scheduler built before and one built after both work, neither warns, the
    learning rate follows both, and the compiled step is equal to eager's."""
    def make(params):
        return muon_compile.Muon(params, lr=0.02)

    def before(opt):
        return LambdaLR(opt, lambda i: 1.0 / (1 + i))

    def after(opt):
        return CosineAnnealingLR(opt, T_max=4)

    eager, eager_opt = _run(make, False, before=before, after=after)
    frames = dynamo_frames()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled, opt = _run(make, True, before=before, after=after)
    # the scheduler's: "optimizer.step() has been overridden ...", "lr_scheduler.step() before optimizer.step()"
    assert not [w for w in caught if "optimizer.step()" in str(w.message)], [str(w.message) for w in caught]
    assert opt.step._wrapped_by_lr_sched and eager_opt.step._wrapped_by_lr_sched  # the scheduler's mark, as eager's
    assert dynamo_frames() - frames == 1, "one compile for three steps under two schedulers"
    assert float(opt.param_groups[0]["lr"]) == float(eager_opt.param_groups[0]["lr"])
    _assert_same(compiled, eager)


def test_bound_method_hooks_closure_and_state():
    """``opt.step`` is a bound method of ``opt``; the step hooks run around it, eagerly; a
    closure runs eagerly (Dynamo compiles the update alone) and its loss comes back; the
    state dict loads into a fresh optimizer that continues as the compiled one."""
    params = make_params(SHAPES)
    eager_params = make_params(SHAPES)
    opt, eager = muon_compile.Muon(params, lr=0.02), muon_compile.Muon(eager_params, lr=0.02)
    assert compile_step(opt) is opt
    assert opt.step.__self__ is opt and opt.step.__func__ is not None
    calls = []
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.append(("pre", torch.compiler.is_compiling())))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append(("post", torch.compiler.is_compiling())))

    def closure_of(ps, seed):
        def closure():
            set_grads(ps, seed)
            return torch.tensor(float(seed))
        return closure

    frames = dynamo_frames()
    for seed in range(2):
        assert opt.step(closure_of(params, seed)) == seed
        eager.step(closure_of(eager_params, seed))
    with torch.no_grad():  # entered in the update's own grad mode: no recompile on Dynamo's grad-mode guard
        opt.step(closure_of(params, 2))
        eager.step(closure_of(eager_params, 2))
    assert dynamo_frames() - frames == 1, "the update compiled once, the closure never"
    assert calls == [("pre", False), ("post", False)] * 3
    _assert_same(params, eager_params)

    fresh_params = [p.detach().clone().requires_grad_() for p in params]
    fresh = muon_compile.Muon(fresh_params, lr=0.02)
    fresh.load_state_dict(copy.deepcopy(opt.state_dict()))  # as from a checkpoint: state_dict() holds the live tensors
    compile_step(fresh)
    for ps, o in ((params, opt), (fresh_params, fresh)):
        set_grads(ps, 5)
        o.step()
    for p, q in zip(params, fresh_params):
        torch.testing.assert_close(q, p, rtol=0, atol=0)


def test_copies_are_uncompiled_and_uncompile_step_restores_the_step():
    """``copy.deepcopy`` and ``pickle`` copy what ``Optimizer.__getstate__`` names: an
    uncompiled optimizer that steps as the original's eager twin; compile_step twice is one;
    uncompile_step gives back the class's step (and a scheduler's wrapper of it)."""
    params = make_params(SHAPES)
    opt = muon_compile.Muon(params, lr=0.02)
    scheduler = LambdaLR(opt, lambda i: 1.0)
    wrapped = opt.step
    compile_step(opt)
    compiled = opt.step
    assert compile_step(opt).step is compiled
    eager = muon_compile.Muon(make_params(SHAPES), lr=0.02)
    set_grads(eager.param_groups[0]["params"], 0)
    eager.step()
    for clone in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))):
        assert "step" not in clone.__dict__
        set_grads(clone.param_groups[0]["params"], 0)  # a copied parameter has no gradient
        clone.step()  # eagerly, on its own stacks (a copy had none before MuonAdamW.__getstate__)
        for c, e in zip(clone.param_groups[0]["params"], eager.param_groups[0]["params"]):
            torch.testing.assert_close(c, e, rtol=0, atol=0)
    uncompile_step(opt)
    assert opt.step is wrapped
    scheduler.step()
    uncompile_step(opt)  # nothing left to undo
    assert opt.step is wrapped
    other = compile_step(muon_compile.Muon(make_params(SHAPES), lr=0.02))
    LambdaLR(other, lambda i: 1.0)  # a scheduler built after wraps the compiled step: still compiled
    assert compile_step(other).step is other.step


def test_bad_calls_are_refused_by_name():
    params = make_params(SHAPES)
    with pytest.raises(TypeError, match="compile_step takes a torch.optim.Optimizer, got Linear"):
        compile_step(torch.nn.Linear(2, 2))
    opt = muon_compile.Muon(params, lr=0.02)
    with pytest.raises(ValueError, match=r"compile_step\(dynamic=True\) is refused"):
        compile_step(opt, dynamic=True)
    opt.step = lambda closure=None: None
    with pytest.raises(ValueError, match="Muon.step was replaced on this optimizer by <function"):
        compile_step(opt)


@pytest.mark.slow
def test_unmodified_torch_muon_and_a_grad_scaler():
    """Unmodified ``torch.optim.Muon`` through compile_step, stepped by
    ``torch.amp.GradScaler`` (fp16 scaling on the CPU): a step whose gradients hold an inf is
    skipped (the scaler never calls ``opt.step``), the others equal eager's."""
    def run(compiled):
        params = make_params(SHAPES)
        opt = torch.optim.Muon(params, lr=0.02)
        if compiled:
            compile_step(opt)
        scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
        for seed in range(3):
            set_grads(params, seed)  # the loss sum(p * g) has the gradients g
            directions = [p.grad for p in params]
            for p in params:
                p.grad = None
            scaler.scale(sum((p * d).sum() for p, d in zip(params, directions))).backward()
            if seed == 1:
                params[0].grad[0, 0] = float("inf")
            before = [p.detach().clone() for p in params]
            scaler.step(opt)
            scaler.update()
            if seed == 1:
                assert all(torch.equal(b, p) for b, p in zip(before, params)), "the inf step was skipped"
        return params

    _assert_same(run(True), run(False))


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_step_through_compile_step_under_schedulers_matches_one_process():
    """compile_step on FSDP2 (world 2, gloo): ``opt.step()`` under a scheduler built before and
    one after, three steps, equal to the same run eager in one process (fp32 Newton–Schulz)."""
    from dist_harness import run_world
    from dist_workers import FSDP_SHAPES, compile_step_run, initial_weights

    opt_kw = dict(lr=0.05, momentum=0.9, weight_decay=0.1, ns_dtype=torch.float32)
    reference, _ = compile_step_run(0, 0, 3, opt_kw)
    start = initial_weights(FSDP_SHAPES)
    for rank, (weights, counters) in enumerate(run_world(compile_step_run, 2, 3, opt_kw, timeout=300)):
        assert counters["distribute.buckets"] >= 1, counters  # the step ran compiled, distributed by the passes
        for i, (got, want, s) in enumerate(zip(weights, reference, start)):
            assert_rel_close(got - s, want - s, NS_RTOL["cpu"][torch.float32], f"rank {rank} matrix {i}")


@pytest.mark.slow
@pytest.mark.parametrize("kind, flatten", [("MuonAdamW", False), ("torch.optim.Muon", True)], ids=["nested", "flattened"])
def test_distributed_checkpoint_state_dict_round_trip(kind, flatten):
    """``torch.distributed.checkpoint.state_dict``'s ``get_optimizer_state_dict`` /
    ``set_optimizer_state_dict`` (FQN-keyed, nested or flattened) see the optimizer as without
    compile_step, and the loaded optimizer continues bit-identically to the one saved (the same
    compiled program on the same values). ``set_optimizer_state_dict`` first makes a fresh
    optimizer's state by a zero-lr step with zero gradients under ``torch.no_grad`` (torch's
    ``_init_optim_state``) where it has none: ``torch.optim.Muon``'s, whose state is lazy (the
    step is the compiled one, ``lr`` a 0-D tensor set to 0 and back), then replaces its state
    tensors, which its graph holds by identity: one more compile, as with
    ``torch.compile(opt.step)``. ``MuonAdamW``'s stacked state exists from construction and is
    loaded in place: one compile in all."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict,
    )

    options = StateDictOptions(flatten_optimizer_state_dict=flatten)

    def model_and_opt():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.Linear(24, 24), torch.nn.Linear(24, 8))
        if kind == "MuonAdamW":
            opt = muon_compile.MuonAdamW(muon_compile.muon_param_groups(model, head_names=("2",)), lr=0.02)
        else:
            opt = torch.optim.Muon([model[0].weight, model[1].weight], lr=torch.tensor(0.02))
        return model, compile_step(opt)

    def step(model, opt, seed):
        set_grads(list(model.parameters()), seed)
        opt.step()

    model, opt = model_and_opt()
    for seed in range(2):
        step(model, opt, seed)
    saved = copy.deepcopy(get_optimizer_state_dict(model, opt, options=options))
    keys = saved if flatten else saved["state"]
    assert any("1.weight" in str(k) for k in keys), f"FQN keys: {list(keys)[:4]}"
    fresh_model, fresh = model_and_opt()
    fresh_model.load_state_dict(model.state_dict())
    frames = dynamo_frames()
    set_optimizer_state_dict(fresh_model, fresh, saved, options=options)
    assert dynamo_frames() - frames == (kind == "torch.optim.Muon"), "the zero-lr step, compiled, where the state is lazy"
    for m, o in ((model, opt), (fresh_model, fresh)):
        step(m, o, 7)
    assert dynamo_frames() - frames == (2 if kind == "torch.optim.Muon" else 1)
    for p, q in zip(model.parameters(), fresh_model.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("kwargs", ["options", "mode"])
def test_torch_compile_arguments_pass_through(kwargs):
    """``torch.compile``'s arguments reach the compile: ``options=`` (a user's post-grad pass,
    which runs after this backend's passes) with ``dynamic=False``, or ``mode="reduce-overhead"``
    (on the CPU no CUDA graph is captured; the step runs as without it); equal to eager."""
    seen = []

    def user_pass(graph):
        seen.append(len(graph.nodes))

    compile_kwargs = dict(options={"post_grad_custom_post_pass": user_pass}, dynamic=False) if kwargs == "options" \
        else dict(mode="reduce-overhead")
    eager, _ = _run(lambda ps: muon_compile.Muon(ps, lr=0.02), False)
    params = make_params(SHAPES)
    opt = compile_step(muon_compile.Muon(params, lr=0.02), **compile_kwargs)
    for seed in range(3):
        set_grads(params, seed)
        opt.step()
    assert bool(seen) == (kwargs == "options"), seen
    _assert_same(params, eager)

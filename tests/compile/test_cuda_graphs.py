"""A compiled step replayed as a CUDA graph (:mod:`muon_compile.compile.cuda_graphs`).

Here, without a GPU: which 0-D CPU inputs a Dynamo graph writes (those cannot be lifted to
the GPU), the decision on the graphs of real optimizer steps with their CUDA inputs faked,
the lifted step's calling on the CPU, and the optimizers' counters on the parameters'
device. Where CUDA exists (``pytest -m cuda``; scripts/gpu_check.sh's ``tests`` step): the
captured step against eager under an LR scheduler, and the traps of captured optimizer steps
(a parameter without a gradient at capture, a checkpoint loaded after capture, a recompile,
the process group shut down after capture).

Tolerances: the compiled step against eager within ``NS_RTOL`` (the bf16 Newton–Schulz
bound of tests/support/numerics.py), as every compiling test.
"""

import copy
import textwrap
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import muon_compile
from muon_compile.compile import cuda_graphs
from muon_compile.diagnostics import explain
import script_runs
from helpers import GraphCapture, make_params, set_grads, step_and_compare, sync_to_eager
from numerics import NS_RTOL, assert_rel_close

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _dynamo_graph(fn, *args):
    """The graph Dynamo hands a backend for ``fn(*args)``, and its example inputs."""
    capture = GraphCapture()
    torch._dynamo.reset()
    torch.compile(fn, backend=capture, fullgraph=True)(*args)
    return capture.only, capture.inputs[0]


def _as_cuda(inputs):
    """A CUDA step's inputs without a GPU: the tensors of one or more dimensions as fake CUDA
    tensors, the 0-D ones left on the CPU."""
    with FakeTensorMode():
        return [torch.empty(t.shape, dtype=t.dtype, device="cuda") if t.dim() else t for t in inputs]


# ----------------------------------------------------------- which inputs a graph writes

def _add(p, s):
    s.add_(1)


def _add_through_view(p, s):
    s.view(1).mul_(2)


def _out(p, s):
    torch.add(p.sum(), 1, out=s)


def _in_place_operator(p, s):
    s += p.sum()


def _item_assignment(p, s):
    s[...] = p.sum()


def _aten_op(p, s):
    torch.ops.aten.add_.Scalar(s, 1)


def _foreach(p, s):
    torch._foreach_mul_([s, p], 2.0)


def _reads_only(p, s):
    p.mul_(1 - s).add_(p * s, alpha=-1.0)


@pytest.mark.parametrize("fn", [_add, _add_through_view, _out, _in_place_operator, _item_assignment, _aten_op, _foreach])
def test_a_graph_that_writes_a_0d_input_is_seen_whatever_the_spelling(fn):
    gm, inputs = _dynamo_graph(fn, torch.ones(4, 4), torch.tensor(0.5))
    scalars = cuda_graphs.cpu_scalars(inputs)
    assert len(scalars) == 1
    assert cuda_graphs.written_inputs(gm, scalars) == ["L['s']"]


def test_a_graph_that_only_reads_a_0d_input_writes_none():
    gm, inputs = _dynamo_graph(_reads_only, torch.ones(4, 4), torch.tensor(0.5))
    assert cuda_graphs.written_inputs(gm, cuda_graphs.cpu_scalars(inputs)) == []


# ----------------------------------------------------------- the decision on real steps

def _step_graph(opt, params):
    set_grads(params, 0)
    return _dynamo_graph(opt.step)


def test_torch_muon_with_a_tensor_lr_is_lifted(monkeypatch):
    """Unmodified torch.optim.Muon with a tensor learning rate on CUDA: the graph only reads
    its 0-D CPU inputs, so the CUDA graph is kept and they are lifted, not static."""
    params = make_params([(8, 12), (12, 8)])
    gm, inputs = _step_graph(torch.optim.Muon(params, lr=torch.tensor(0.02)), params)
    monkeypatch.setattr(explain, "_warned", set())
    patches = {"triton.cudagraphs": True}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lift = cuda_graphs.decide(gm, patches, _as_cuda(inputs))
    assert patches["triton.cudagraphs"] is True
    assert lift is not None and lift.positions == tuple(cuda_graphs.cpu_scalars(inputs)) and lift.positions
    assert lift.device.type == "cuda"
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    assert all("_dynamo_static_input_type" not in placeholders[i].meta.get("tensor_dict", {}) for i in lift.positions)


def test_a_step_that_writes_a_cpu_counter_keeps_no_cuda_graph_and_names_it(monkeypatch):
    """An AdamW group's step counter on the CPU (its parameters are here) is written by the
    step: on CUDA that step is compiled without a CUDA graph, with one warning naming it."""
    params = make_params([(8, 12), (12,)])
    opt = muon_compile.MuonAdamW([{"params": params[:1], "kind": "muon"}, {"params": params[1:], "kind": "adamw"}])
    gm, inputs = _step_graph(opt, params)
    monkeypatch.setattr(explain, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            patches = {"triton.cudagraphs": True}
            assert cuda_graphs.decide(gm, patches, _as_cuda(inputs)) is None
            assert patches["triton.cudagraphs"] is False
        untouched = {}
        assert cuda_graphs.decide(gm, untouched, _as_cuda(inputs)) is None and untouched == {}
    messages = [str(w.message) for w in caught if "CUDA graph" in str(w.message)]
    assert len(messages) == 1, messages
    assert "['step']" in messages[0] and "compiled without a CUDA graph" in messages[0]


def test_counters_live_on_the_parameters_device():
    """AdamW's step counts and skip_nonfinite's counter are made on the parameters' device
    (so a step on a GPU writes no CPU tensor), and a checkpoint's are loaded there."""
    params = [torch.nn.Parameter(torch.empty(8, 12, device="meta")), torch.nn.Parameter(torch.empty(12, device="meta"))]
    groups = [{"params": params[:1], "kind": "muon"}, {"params": params[1:], "kind": "adamw"}]
    opt = muon_compile.MuonAdamW(groups, skip_nonfinite=True)
    assert opt.state[params[1]]["step"].device.type == "meta"
    assert all(g["skipped_steps"].device.type == "meta" for g in opt.param_groups)
    saved = opt.state_dict()
    saved["state"][1]["step"] = torch.tensor(3.0)
    for group in saved["param_groups"]:
        group["skipped_steps"] = torch.tensor(2)
    opt.load_state_dict(saved)
    assert opt.state[params[1]]["step"].device.type == "meta"
    assert all(g["skipped_steps"].device.type == "meta" for g in opt.param_groups)


# ----------------------------------------------------------- the lifted step's calling

def test_a_lifted_step_reads_each_calls_hyper_parameters(monkeypatch):
    """The lift forced on the CPU (every 0-D input restacked each call, as on CUDA): the
    compiled step follows a scheduler's learning rate step by step, equal to eager."""
    lifts = []

    def lift_all(gm, patches, example_inputs):
        lifts.append(cuda_graphs.Lift.of(cuda_graphs.cpu_scalars(example_inputs), example_inputs, torch.device("cpu")))
        return lifts[-1]

    monkeypatch.setattr(cuda_graphs, "decide", lift_all)
    torch._dynamo.reset()
    eager_params, params = make_params([(8, 12), (12, 8)]), make_params([(8, 12), (12, 8)])
    eager, opt = (muon_compile.Muon(p, ns_dtype=torch.float32) for p in (eager_params, params))
    step = torch.compile(opt.step, backend="muon", fullgraph=True)  # before the scheduler wraps opt.step
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + s)) for o in (eager, opt)]
    for s in range(3):
        set_grads(eager_params, s)
        set_grads(params, s)
        before = [p.detach().clone() for p in eager_params]
        eager.step()
        step()
        for schedule in schedules:
            schedule.step()
        for e, c, b in zip(eager_params, params, before):
            assert_rel_close(c.detach() - b, e.detach() - b, NS_RTOL["cpu"][torch.float32], f"step {s}")
    # two backend calls: the inputs lifted onto the CPU are new 0-D float64 CPU tensors, whose .item()
    # symbols AOTAutograd makes afresh and Dynamo restarts for (muon_compile.compile.tensorify); on CUDA they have none
    assert len(lifts) == 2 and all(lift.positions for lift in lifts)


# ----------------------------------------------------------- on CUDA

def _captured_pair(make_opt, shapes, **compile_kw):
    """Eager and captured optimizers over equal parameters on CUDA, and the captured step."""
    eager_params, params = make_params(shapes, device="cuda"), make_params(shapes, device="cuda")
    eager, opt = make_opt(eager_params), make_opt(params)
    step = torch.compile(opt.step, backend="muon", options={"triton.cudagraphs": True}, **compile_kw)
    return (eager_params, eager), (params, opt), step


def _same_step(eager_params, params, eager, opt, step, seed, what):
    """:func:`helpers.step_and_compare` at the bf16 bound on CUDA; the sync keeps the captured
    addresses (it copies in place)."""
    step_and_compare(eager_params, params, eager, opt, step, seed, NS_RTOL["cuda"][torch.bfloat16], what)


def _mixed(params):
    return muon_compile.MuonAdamW([{"params": params[:-1], "kind": "muon"}, {"params": params[-1:], "kind": "adamw"}])


@pytest.mark.cuda
@needs_cuda
def test_a_captured_step_follows_the_scheduler():
    from torch._dynamo.utils import counters

    counters.clear()
    torch._dynamo.reset()
    (eager_params, eager), (params, opt), step = _captured_pair(_mixed, [(64, 96), (96, 64), (64, 64), (64,)])
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + s)) for o in (eager, opt)]
    for s in range(4):
        _same_step(eager_params, params, eager, opt, step, s, f"step {s}")
        for schedule in schedules:
            schedule.step()
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.cuda
@needs_cuda
def test_unmodified_torch_muon_with_a_tensor_lr_is_captured_and_scheduled():
    from torch._dynamo.utils import counters

    counters.clear()
    torch._dynamo.reset()
    (eager_params, eager), (params, opt), step = _captured_pair(
        lambda p: torch.optim.Muon(p, lr=torch.tensor(0.02)), [(64, 96), (96, 64)]
    )
    schedules = [torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4) for o in (eager, opt)]
    for s in range(4):
        _same_step(eager_params, params, eager, opt, step, s, f"step {s}")
        for schedule in schedules:
            schedule.step()
    assert counters["inductor"]["cudagraph_skips"] == 0


@pytest.mark.cuda
@needs_cuda
def test_a_parameter_without_a_gradient_at_capture_is_updated_once_it_has_one():
    torch._dynamo.reset()
    (eager_params, eager), (params, opt), step = _captured_pair(_mixed, [(64, 96), (96, 64), (64,)])
    for p in (eager_params[1], params[1]):
        p.requires_grad_(False)
    for s in range(2):  # captured without the second matrix's gradient
        set_grads(eager_params, s)
        set_grads(params, s)
        eager_params[1].grad = params[1].grad = None
        eager.step()
        step()
    sync_to_eager(eager_params, params, eager, opt)
    for p in (eager_params[1], params[1]):
        p.requires_grad_(True)
    unchanged = params[1].detach().clone()
    _same_step(eager_params, params, eager, opt, step, 7, "after the gradient appeared")
    assert not torch.equal(params[1], unchanged)


@pytest.mark.cuda
@needs_cuda
def test_a_checkpoint_loaded_after_capture_is_the_next_steps_state():
    from torch._dynamo.utils import counters

    counters.clear()
    torch._dynamo.reset()
    (eager_params, eager), (params, opt), step = _captured_pair(_mixed, [(64, 96), (96, 64), (64,)])
    for s in range(2):
        _same_step(eager_params, params, eager, opt, step, s, f"step {s}")
    donor_params = make_params([(64, 96), (96, 64), (64,)], seed=5, device="cuda")
    donor = _mixed(donor_params)
    for s in range(3):
        set_grads(donor_params, 50 + s)
        donor.step()
    checkpoint = donor.state_dict()
    eager.load_state_dict(copy.deepcopy(checkpoint))  # load_state_dict keeps the tensors it is given, as torch.optim's
    opt.load_state_dict(copy.deepcopy(checkpoint))
    _same_step(eager_params, params, eager, opt, step, 9, "after loading")
    assert counters["inductor"]["cudagraph_skips"] == 0  # captured, and the load replayed it
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.cuda
@needs_cuda
def test_a_recompile_captures_anew():
    from torch._dynamo.utils import counters

    counters.clear()
    torch._dynamo.reset()
    (eager_params, eager), (params, opt), step = _captured_pair(_mixed, [(64, 96), (96, 64), (64,)])
    _same_step(eager_params, params, eager, opt, step, 0, "before")
    for o in (eager, opt):
        o.param_groups[0]["nesterov"] = not o.param_groups[0]["nesterov"]  # a Python bool: Dynamo recompiles
    for s in range(1, 3):
        _same_step(eager_params, params, eager, opt, step, s, f"after the recompile, step {s}")
    assert counters["stats"]["unique_graphs"] == 2  # the recompile happened
    assert counters["inductor"]["cudagraph_skips"] == 0  # and both graphs were captured


_TEARDOWN = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import muon_compile
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)  # one rank: no port to take
    mesh = init_device_mesh("cuda", (1,))
    model = torch.nn.Sequential(torch.nn.Linear(64, 96, bias=False), torch.nn.Linear(96, 64, bias=False)).cuda()
    fully_shard(model, mesh=mesh)
    opt = muon_compile.Muon(list(model.parameters()))
    step = torch.compile(opt.step, backend="muon", options={"triton.cudagraphs": True})
    for _ in range(3):
        model(torch.randn(8, 64, device="cuda")).sum().backward()
        step()
    torch.cuda.synchronize()
    dist.destroy_process_group()
    print("shut down")
    """
)


@pytest.mark.cuda
@needs_cuda
def test_the_process_group_shuts_down_after_capture():
    assert "shut down" in script_runs.python("-c", _TEARDOWN, timeout=300).stdout

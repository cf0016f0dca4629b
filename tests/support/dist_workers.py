"""Functions that run on every rank of a gloo world (see dist_harness.run_world), and the
single-process references they are compared with."""

from __future__ import annotations

import ast
import datetime
import re
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn

import muon_compile
from muon_compile import config
from muon_compile.diagnostics import explain

from helpers import dumped_graphs, graph_caches_off

# Rows chosen against W = 2 and 3: even (24), uneven (10, 7), fewer rows than ranks (1),
# and a tall / wide pair that share a canonical shape (40x12, 12x40).
FSDP_SHAPES = [(24, 16), (10, 16), (7, 16), (1, 16), (40, 12), (12, 40)]
COLLECTIVE = re.compile(
    r"^v\d+: (.+?) = _c10d_functional\.(all_to_all_single|all_gather_into_tensor|all_reduce|reduce_scatter_tensor)"
    r"\((.*)\)(?:  # .*)?$"
)
# a wait for collective buffer ``buf`` in Inductor's generated wrapper code
GENERATED_WAIT = re.compile(r"_c10d_functional\.wait_tensor\.default\((\w+)\)")


class Stack(nn.Module):
    """One bias-free Linear per shape; weight ``(out, in)`` = the shape."""

    def __init__(self, shapes):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(i, o, bias=False) for o, i in shapes)


def preloaded(rank, world):
    """What a rank finds done when it starts (``dist_harness._PRELOAD``): whether the forkserver
    imported ``rank_preload`` and chose Inductor's CPU vector ISA for it."""
    import sys

    from torch._inductor import cpu_vec_isa

    return {"rank_preload": "rank_preload" in sys.modules, "isa_chosen": cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 1}


def initial_weights(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in shapes]


def step_grads(shapes, step):
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(s, generator=g) for s in shapes]


class HandWrittenMuon:
    """:func:`hand_written_step` around Keller Jordan's loop (tests/support/ns_forms.py) as an optimizer
    with a ``step``: the Muon a user writes, no ``torch.optim`` base."""

    def __init__(self, params, lr=0.05, momentum=0.9, dtype=torch.bfloat16):
        self.params, self.lr, self.momentum, self.dtype = list(params), lr, momentum, dtype
        self.bufs = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self):
        from ns_forms import FORMS

        hand_written_step(self.params, self.bufs, FORMS["keller"], self.dtype, self.lr, self.momentum)


def make_optimizer(kind, params, opt_kw):
    """``muon_compile.Muon`` (``kind="muon_compile"``), the unmodified ``torch.optim.Muon``
    (``"torch"``), a :class:`HandWrittenMuon` (``"hand_written"``: ``lr``, ``momentum`` and
    ``dtype`` of ``opt_kw``), ``muon_compile.MuonAdamW`` with AdamW on the last parameter
    (``"muon_adamw"``), or Muon with the first parameter split as a fused QKV (``"split_qkv"``)."""
    if kind == "hand_written":  # dtype: the Newton-Schulz's (float64 for the exact evaluation)
        return HandWrittenMuon(params, opt_kw["lr"], opt_kw["momentum"], opt_kw.get("dtype", torch.bfloat16))
    if kind == "muon_adamw":
        groups = [{"params": params[:-1], "kind": "muon"}, {"params": params[-1:], "kind": "adamw"}]
        return muon_compile.MuonAdamW(groups, **opt_kw)
    if kind == "split_qkv":  # the first (24-row) matrix as a fused QKV of 12 + 6 + 6 rows
        return muon_compile.Muon([{"params": params[:1], "split_rows": (12, 6, 6)}, {"params": params[1:]}], **opt_kw)
    return {"muon_compile": muon_compile.Muon, "torch": torch.optim.Muon}[kind](params, **opt_kw)


def reference_run(shapes, steps, optimizer="muon_compile", **opt_kw):
    """Muon on the whole matrices in one process, eager: the distributed runs must match it.
    ``steps``: how many steps (0, 1, ...), or which ones (their gradients are step_grads')."""
    params = [nn.Parameter(w) for w in initial_weights(shapes)]
    opt = make_optimizer(optimizer, params, opt_kw)
    for s in range(steps) if isinstance(steps, int) else steps:
        for p, g in zip(params, step_grads(shapes, s)):
            p.grad = g
        opt.step()
    return [p.detach() for p in params]


def collective_sequence(graph_text: str) -> list[tuple[str, str, str]]:
    """``(kind, result type, arguments after the tensor)`` of each collective of a dumped
    graph, in graph order; e.g. ``("all_to_all_single", "bf16[640]", "[320, 320], [448, 192], '0'")``."""
    seq = []
    for line in graph_text.splitlines():
        match = COLLECTIVE.search(line)
        if match:
            result_type, kind, args = match.groups()
            seq.append((kind, result_type, args.split(", ", 1)[1]))
    return seq


def launches_and_waits(code: str) -> list[str]:
    """The collectives of Inductor's generated wrapper ``code`` in the order it runs them:
    ``"L<n>"`` for the launch of the n-th collective, ``"W<n>"`` for its ``wait_tensor``."""
    launched: dict[str, int] = {}
    seq = []
    for line in code[code.index("def call(self, args)") :].splitlines():
        if m := re.search(r"(\w+) = torch\.ops\._c10d_functional\.\w+\.default\(", line):
            launched[m.group(1)] = len(launched)
            seq.append(f"L{launched[m.group(1)]}")
        elif m := GENERATED_WAIT.search(line):
            seq.append(f"W{launched[m.group(1)]}")
    return seq


def count_collectives(step) -> int:
    """Collective kernels launched by one call of ``step`` (profiler events)."""
    kinds = ("all_to_all", "all_gather", "allgather", "all_reduce", "allreduce", "reduce_scatter", "broadcast")
    with torch.profiler.profile() as prof:
        step()
    names = [e.name for e in prof.events() if e.name.startswith(("_c10d_functional::", "c10d::", "gloo:"))]
    return sum(1 for n in names if n.startswith("_c10d_functional::") and any(k in n for k in kinds))


def device_mesh(world, mesh_shape=None):
    """A 1-D CPU mesh of ``world`` ranks, or an HSDP mesh ``("replicate", "shard")`` of ``mesh_shape``."""
    from torch.distributed.device_mesh import init_device_mesh

    if mesh_shape is None:
        return init_device_mesh("cpu", (world,))
    return init_device_mesh("cpu", mesh_shape, mesh_dim_names=("replicate", "shard"))


def sharded_stack(shapes, mesh):
    """The weights of a Stack of ``shapes`` (:func:`initial_weights`), FSDP2-sharded on ``mesh``."""
    from torch.distributed.fsdp import fully_shard

    model = Stack(shapes)
    with torch.no_grad():
        for layer, w in zip(model.layers, initial_weights(shapes)):
            layer.weight.copy_(w)
    fully_shard(model, mesh=mesh)
    return [layer.weight for layer in model.layers]


def distribute_like(tensor, like):
    """``tensor`` sharded like the DTensor ``like`` (``tensor`` itself when ``like`` is plain)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    return distribute_tensor(tensor, like.device_mesh, like.placements) if isinstance(like, DTensor) else tensor


def set_step_grads(params, shapes, step):
    """Give the sharded ``params`` the global gradients of ``step``, sharded like them."""
    for p, g in zip(params, step_grads(shapes, step)):
        p.grad = distribute_like(g, p)


def fsdp_muon(rank, world, shapes, steps, strategy, opt_kw, mesh_shape=None, optimizer="muon_compile", config_changes=None):
    """FSDP2-shard a Stack of ``shapes`` over ``world`` gloo ranks (optionally an HSDP
    ``mesh_shape``), run ``steps`` compiled Muon steps (``optimizer``: see
    :func:`make_optimizer`; ``config_changes``: settings beside ``strategy``) with fixed
    global gradients, and return the full weights, this rank's post-pass graph's
    collectives, the collectives launched per step, the pass counters and the plans
    (buckets, distribution) of the graphs compiled (``muon_compile.diagnostics.explain``)."""
    from torch._dynamo.utils import counters as dynamo_counters

    params = sharded_stack(shapes, device_mesh(world, mesh_shape))
    opt = make_optimizer(optimizer, params, opt_kw)
    dynamo_counters.clear()
    with tempfile.TemporaryDirectory() as dump, config.override(strategy=strategy, dump_dir=dump, **(config_changes or {})):
        step = torch.compile(opt.step, backend="muon")
        for s in range(steps):
            set_step_grads(params, shapes, s)
            step()
        graphs = dumped_graphs(dump)
    # copies: on a mesh of one rank full_tensor() is the parameter itself, which the
    # step that count_collectives runs would change
    final = [p.full_tensor().clone() for p in params]
    launched = count_collectives(step)
    last = graphs.get("lower_after", "")
    return {
        "weights": final,
        "collectives": collective_sequence(last),
        "launched": launched,
        "counters": dict(muon_compile.counters),
        "graph": last,
        "graphs_compiled": dynamo_counters["stats"]["unique_graphs"],
        "plans": [plan for report in explain.reports() for plan in report.plans],
        # each state tensor laid out like its parameter (sharded state, no gather needed)
        "state_like_params": all(
            v.placements == p.placements and v.to_local().shape == p.to_local().shape
            for p in params for v in opt.state[p].values() if v.dim() > 0
        ),
    }


def fsdp_graphs(rank, world, shapes, mesh_shape=None, config_changes=None, optimizer="muon_compile", options=None):
    """The pipeline's dumped graphs for a Muon step over an FSDP2 Stack of ``shapes`` on
    ``world`` ranks (optionally an HSDP ``mesh_shape``), plus ``"groups"``: each mesh
    group's name and size, and ``"code"``: Inductor's generated code, one string per
    graph. Meant for the fake process group (``run_fake``): the step is compiled by the
    muon backend but run eagerly, because the fake group cannot execute an all-to-all
    whose input is empty on some rank. ``options``: Inductor's, as ``torch.compile`` passes them."""
    mesh = device_mesh(world, mesh_shape)
    params = sharded_stack(shapes, mesh)
    set_step_grads(params, shapes, 0)
    return _compiled_graphs(make_optimizer(optimizer, params, {}), mesh, config_changes, options)


def _compiled_graphs(opt, mesh, config_changes=None, options=None):
    """``opt``'s step compiled by the muon backend and run eagerly (see :func:`fsdp_graphs`):
    the dumped graphs, ``"groups"`` (each of ``mesh``'s dimension groups by name, its size)
    and ``"code"``."""
    from torch._inductor.utils import run_and_get_code

    from muon_compile.compile.backend import muon_backend

    def graphs_only(gm, example_inputs):
        muon_backend(gm, example_inputs, options=options)
        return gm.forward

    with tempfile.TemporaryDirectory() as dump, graph_caches_off(), config.override(dump_dir=dump, **(config_changes or {})):
        _, code = run_and_get_code(torch.compile(opt.step, backend=graphs_only))
        graphs = dumped_graphs(dump)
    groups = {mesh.get_group(d).group_name: mesh.size(d) for d in range(mesh.ndim)}
    return {**graphs, "groups": groups, "code": code}


def tp_graphs(rank, world, mesh_shape, opt_kw=None, optimizer="muon_compile", names=None):
    """:func:`_compiled_graphs` of Muon (:func:`make_optimizer`'s kind ``optimizer``) of the
    weights ``names`` (default: all) of :func:`tp_block_model` (``mesh_shape`` of three sizes:
    HSDP over TP) with step 0's gradients: for the fake process group."""
    model, params = tp_block_model(mesh_shape)
    set_tp_grads(params, 0)
    opt = make_optimizer(optimizer, _named(params, names or TP_NAMES), opt_kw or {})
    return _compiled_graphs(opt, params[0].device_mesh)


def _named(params, names):
    """Those of :func:`tp_block_model`'s weights (in ``TP_NAMES`` order) named in ``names``."""
    return [p for name, p in zip(TP_NAMES, params) if name in names]


def assert_same_collectives(sequences):
    """Every rank issues the same collectives in the same order: same kind and group, the
    same all-gather sizes, and all-to-all splits that agree (what rank i sends to rank j
    is what rank j expects from rank i). ``sequences`` holds every rank's, rank order."""
    first = sequences[0]
    for rank, seq in enumerate(sequences):
        assert [(k, a.rsplit(", ", 1)[1]) for k, _, a in seq] == [(k, a.rsplit(", ", 1)[1]) for k, _, a in first], rank
    for step, calls in enumerate(zip(*sequences)):
        kind = calls[0][0]
        if kind == "all_gather_into_tensor":
            assert len({(t, a) for _, t, a in calls}) == 1, (step, calls)
        if kind == "all_to_all_single":
            splits = [ast.literal_eval("(" + a.rsplit(", ", 1)[0] + ")") for _, _, a in calls]  # (out, in)
            for i, (_, sent) in enumerate(splits):
                for j, (expected, _) in enumerate(splits):
                    assert sent[j] == expected[i], (step, i, j, splits)


def generated_code(rank, world, shapes, config_changes=None):
    """Inductor's generated code of one compiled Muon step over an FSDP2 Stack."""
    from torch._inductor.utils import run_and_get_code

    params = sharded_stack(shapes, device_mesh(world))
    set_step_grads(params, shapes, 0)
    opt = muon_compile.Muon(params)
    with config.override(**(config_changes or {})):
        _, code = run_and_get_code(torch.compile(opt.step, backend="muon"))
    return {"code": code[0], "counters": dict(muon_compile.counters)}


LAYOUT_SHAPES = {"fsdp": (10, 16), "experts": (4, 8, 16), "tp": (16, 12)}


def mixed_layouts(rank, world, steps):
    """One FSDP2 row-sharded matrix, 3-D expert weights sharded on the expert dimension and
    a tensor-parallel ``Shard(1)`` matrix, compiled Muon for ``steps`` steps."""
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = device_mesh(world)
    placements = {"fsdp": Shard(0), "experts": Shard(0), "tp": Shard(1)}
    weights = layout_weights()
    params = {k: nn.Parameter(distribute_tensor(w, mesh, [placements[k]])) for k, w in weights.items()}
    opt = muon_compile.Muon(list(params.items()), lr=0.05, ns_dtype=torch.float32)
    with tempfile.TemporaryDirectory() as dump, config.override(dump_dir=dump):
        step = torch.compile(opt.step, backend="muon")
        for s in range(steps):
            for k, g in layout_grads(s).items():
                params[k].grad = distribute_tensor(g, mesh, [placements[k]])
            step()
        graphs = dumped_graphs(dump)
    return {
        "weights": {k: p.full_tensor() for k, p in params.items()},
        "counters": dict(muon_compile.counters),
        "collectives": collective_sequence(graphs.get("lower_after", "")),
    }


def layout_weights():
    g = torch.Generator().manual_seed(7)
    return {k: torch.randn(s, generator=g) for k, s in LAYOUT_SHAPES.items()}


def layout_grads(step):
    g = torch.Generator().manual_seed(70 + step)
    return {k: torch.randn(s, generator=g) for k, s in LAYOUT_SHAPES.items()}


def layout_reference(steps):
    params = {k: nn.Parameter(w) for k, w in layout_weights().items()}
    opt = muon_compile.Muon(list(params.values()), lr=0.05, ns_dtype=torch.float32)
    for s in range(steps):
        for k, g in layout_grads(s).items():
            params[k].grad = g
        opt.step()
    return {k: p.detach() for k, p in params.items()}


CHECKPOINT_SHAPES = [(24, 16), (7, 16), (1, 16), (12, 40)]


def _checkpoint_model(world, shapes):
    """An FSDP2 Stack of ``shapes``; MuonAdamW with Muon on all but the last weight (AdamW).
    Returns ``(model, params, optimizer)``."""
    from torch.distributed.fsdp import fully_shard

    model = Stack(shapes)
    with torch.no_grad():
        for layer, w in zip(model.layers, initial_weights(shapes)):
            layer.weight.copy_(w)
    fully_shard(model, mesh=device_mesh(world))
    params = [layer.weight for layer in model.layers]
    groups = [{"params": params[:-1], "kind": "muon"}, {"params": params[-1:], "kind": "adamw"}]
    return model, params, muon_compile.MuonAdamW(groups, lr=0.05, weight_decay=0.1, ns_dtype=torch.float32)


def _checkpoint_run(layout, world):
    """``(model, params, optimizer, set_grads(params, step))`` of a checkpoint test:
    ``"fsdp"``, :func:`_checkpoint_model`; ``"tp blockwise"`` etc., :func:`tp_block_model` on
    a 2x2 mesh with Muon in that TP mode."""
    if layout == "fsdp":
        return (*_checkpoint_model(world, CHECKPOINT_SHAPES), lambda params, s: set_step_grads(params, CHECKPOINT_SHAPES, s))
    model, params = tp_block_model((2, 2))
    opt = muon_compile.Muon(params, lr=0.05, weight_decay=0.1, ns_dtype=torch.float32, tp_mode=layout.split()[1])
    return model, params, opt, set_tp_grads


def dcp_resume(rank, world, steps_before, layout="fsdp"):
    """Train ``steps_before`` compiled steps, save model and optimizer with
    torch.distributed.checkpoint, take one more step; then load the checkpoint into a fresh
    model and optimizer (:func:`_checkpoint_run` of ``layout``) and take that step again.
    Returns whether each weight is bit-identical between the two, and the resumed
    optimizer's state keys."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, params, opt, set_grads = _checkpoint_run(layout, world)
    step = torch.compile(opt.step, backend="muon")
    for s in range(steps_before):
        set_grads(params, s)
        step()
    with tempfile.TemporaryDirectory() as local:
        path = [local]
        torch.distributed.broadcast_object_list(path, 0)  # rank 0's directory for every rank
        model_sd, optim_sd = get_state_dict(model, opt)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path[0])
        set_grads(params, steps_before)
        step()
        uninterrupted = [p.full_tensor() for p in params]

        model2, params2, opt2, _ = _checkpoint_run(layout, world)
        model_sd2, optim_sd2 = get_state_dict(model2, opt2)
        state = {"model": model_sd2, "optim": optim_sd2}
        dcp.load(state, checkpoint_id=path[0])
        set_state_dict(model2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
        torch.distributed.barrier()  # rank 0 removes the directory on leaving
    set_grads(params2, steps_before)
    torch.compile(opt2.step, backend="muon")()
    resumed = [p.full_tensor() for p in params2]
    return {
        "identical": [bool(torch.equal(a, b)) for a, b in zip(resumed, uninterrupted)],
        "state_keys": sorted(k for p in params2 for k in opt2.state[p]),
        "tp_mode": opt2.param_groups[0]["tp_mode"],
    }


def dcp_load_other_width(rank, world):
    """Take the sharded optimizer state dict (``get_state_dict``) of a model whose second
    matrix is 7x16 and load it (``set_state_dict``) into one where it is 7x24: the error
    text each rank raises, or "loaded"."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, _, opt = _checkpoint_model(world, CHECKPOINT_SHAPES)
    _, optim_sd = get_state_dict(model, opt)
    wider = [CHECKPOINT_SHAPES[0], (7, 24)] + CHECKPOINT_SHAPES[2:]
    model2, _, opt2 = _checkpoint_model(world, wider)
    try:
        set_state_dict(model2, opt2, model_state_dict=get_state_dict(model2, opt2)[0], optim_state_dict=optim_sd)
    except ValueError as e:
        return str(e)
    return "loaded"


class DenseAndExperts(nn.Module):
    """Two dense layers and an expert stack ``(4, 8, 16)`` (name contains "experts")."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.dense = nn.ModuleList(nn.Linear(16, o, bias=False) for o in (24, 10))
        self.moe = nn.Module()
        self.moe.experts = nn.Parameter(torch.randn(4, 8, 16, generator=g))
        with torch.no_grad():
            for layer in self.dense:
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=g))


def expert_grads(model, step):
    g = torch.Generator().manual_seed(500 + step)
    return {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}


def experts_run(model, steps, compiled):
    opt = muon_compile.MuonAdamW(muon_compile.muon_param_groups(model, expert_keys=["experts"]), lr=0.05, ns_dtype=torch.float32)
    step = torch.compile(opt.step, backend="muon") if compiled else opt.step
    for s in range(steps):
        grads = expert_grads(model, s)
        for n, p in model.named_parameters():
            p.grad = distribute_like(grads[n], p)
        step()
    return step


def experts_own_group(rank, world, steps):
    """Dense layers FSDP2-sharded on the world mesh, the expert stack on a separate expert
    data-parallel group (its own process group, sharded on the expert dimension)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    model = DenseAndExperts()
    expert_mesh = DeviceMesh.from_group(dist.new_group(list(range(world))), "cpu")
    fully_shard(model.moe, mesh=expert_mesh)
    fully_shard(model, mesh=device_mesh(world))
    muon_compile.counters.clear()
    with tempfile.TemporaryDirectory() as dump, config.override(dump_dir=dump):
        step = experts_run(model, steps, compiled=True)
        graphs = dumped_graphs(dump)
    return {
        "weights": {n: p.full_tensor() for n, p in model.named_parameters()},
        "counters": dict(muon_compile.counters),
        "launched": count_collectives(step),
        "expert_group": model.moe.experts.device_mesh.get_group().group_name,
        "dense_group": model.dense[0].weight.device_mesh.get_group().group_name,
        "collectives": collective_sequence(graphs.get("lower_after", "")),
    }


def experts_reference(steps):
    model = DenseAndExperts()
    experts_run(model, steps, compiled=False)
    return {n: p.detach() for n, p in model.named_parameters()}


def qk_clip_run(rank, world, steps, rope_dim):
    """QK-clip on FSDP2 (``world`` > 1) or in one process (``world`` = 0): the weights after
    ``steps`` compiled (FSDP2) or eager steps with fixed per-head logits."""
    from torch.distributed.fsdp import fully_shard

    from muon_compile import QKClip, QKClipLayer

    heads, head_dim, d = 3, 4, 16
    model = Stack([(heads * head_dim, d), (heads * (head_dim - rope_dim), d), (32, d)])  # query, key, MLP
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    if world:
        fully_shard(model, mesh=device_mesh(world))
    layer = QKClipLayer("layer0", query="layers.0.weight", key="layers.1.weight", heads=heads, head_dim=head_dim, rope_dim=rope_dim)
    opt = muon_compile.Muon(list(model.named_parameters()), lr=0.05, ns_dtype=torch.float32, qk_clip=QKClip(10.0, [layer]))
    step = torch.compile(opt.step, backend="muon") if world else opt.step
    for s in range(steps):
        gen = torch.Generator().manual_seed(40 + s)
        for p in model.parameters():
            p.grad = distribute_like(torch.randn(p.shape, generator=gen), p)
        step(qk_logits={"layer0": torch.tensor([5.0, 40.0, 12.0]) * (s + 1)})
    return {n: (p.full_tensor() if world else p.detach()) for n, p in model.named_parameters()}


FORM_SHAPES = [(24, 16), (10, 16), (7, 16), (40, 12), (12, 40)]  # no matrix with fewer rows than ranks


@torch.no_grad()
def hand_written_step(params, bufs, form, dtype, lr=0.05, momentum=0.9):
    """A hand-written Muon step around one of tests/support/ns_forms.py's Newton–Schulz loops."""
    for p, buf in zip(params, bufs):
        buf.lerp_(p.grad, 1 - momentum)
        update = form(p.grad.lerp(buf, momentum), dtype=dtype)
        p.add_(update.to(p.dtype), alpha=-lr)


def hand_written_run(rank, world, steps, form_name, dtype=torch.bfloat16):
    """:func:`fsdp2_or_eager_run` of a hand-written Muon step around the Newton–Schulz form
    ``form_name`` of tests/support/ns_forms.py."""
    from ns_forms import FORMS

    def make(params):
        bufs = [torch.zeros_like(p) for p in params]
        return lambda: hand_written_step(params, bufs, FORMS[form_name], dtype)

    return fsdp2_or_eager_run(world, steps, make)


def corpus_run(rank, world, steps, name, dtype=None):
    """:func:`fsdp2_or_eager_run` of the step of tests/support/muon_corpus.py's entry ``name``
    (Newton–Schulz in ``dtype``, the entry's own by default)."""
    from muon_corpus import CORPUS

    return fsdp2_or_eager_run(world, steps, lambda params: CORPUS[name].step(params, dtype))


def fsdp2_or_eager_run(world, steps, make_step, shapes=FORM_SHAPES):
    """Weights after ``steps`` calls of ``make_step(params)()`` under ``torch.no_grad``:
    compiled with backend="muon" on FSDP2 (``world`` > 1, also returning the collectives
    launched per step and the counters), or eager in one process (``world`` = 0; nested
    ``torch.compile`` calls run eagerly too)."""
    import contextlib

    if world:
        params = sharded_stack(shapes, device_mesh(world))
    else:
        params = [nn.Parameter(w) for w in initial_weights(shapes)]
    step = torch.no_grad()(make_step(params))
    if world:
        muon_compile.counters.clear()
        step = torch.compile(step, backend="muon")
    eager = contextlib.nullcontext() if world else torch.compiler.set_stance("force_eager")
    for s in range(steps):
        if world:
            set_step_grads(params, shapes, s)
        else:
            for p, g in zip(params, step_grads(shapes, s)):
                p.grad = g.to(p.dtype)
        with eager:
            step()
    if not world:
        return [p.detach() for p in params]
    return {
        "weights": [p.full_tensor() for p in params],
        "launched": count_collectives(step),
        "counters": dict(muon_compile.counters),
    }


def hand_written_forms(rank, world, steps):
    """:func:`hand_written_run` for every form of tests/support/ns_forms.py, one after another."""
    from ns_forms import FORMS

    out = {}
    for name in FORMS:
        torch._dynamo.reset()
        out[name] = hand_written_run(rank, world, steps, name)
    return out


def corpus_entries(rank, world, steps, names):
    """:func:`corpus_run` for each of ``names``, one after another."""
    out = {}
    for name in names:
        torch._dynamo.reset()
        out[name] = corpus_run(rank, world, steps, name)
    return out


# One rank's step made to differ from the others' (tests/distributed/test_rank_agreement.py): a
# setting it overrides, or ("gradient") the parameter whose gradient it drops.
DIVERGENCES = {
    "bucket_mb": dict(bucket_mb=0.0005),
    "strategy": dict(strategy="all_gather"),
    "tp_mode": dict(tp_mode="blockwise"),
    "prefetch": dict(prefetch=0),
    "passes": dict(passes="-distribute"),
    "gradient": {},
}
AGREE_SHAPES = [(24, 16), (10, 16), (7, 16)]


def _named_fsdp_muon(world):
    """Muon over an FSDP2 Stack of :data:`AGREE_SHAPES`, parameters named ``layers.<i>.weight``,
    with step 0's gradients set: ``(params, optimizer)``."""
    params = sharded_stack(AGREE_SHAPES, device_mesh(world))
    opt = muon_compile.Muon([(f"layers.{i}.weight", p) for i, p in enumerate(params)], lr=0.02)
    set_step_grads(params, AGREE_SHAPES, 0)
    return params, opt


def _timed_step(step):
    """``(outcome, seconds)``: "ok" or the RankDivergenceError's text."""
    start = time.monotonic()
    try:
        step()
        outcome = "ok"
    except muon_compile.RankDivergenceError as e:
        outcome = str(e)
    return outcome, time.monotonic() - start


def divergent_step(rank, world, case, odd_rank):
    """Compile the Muon step with :data:`DIVERGENCES` ``[case]`` on ``odd_rank`` only."""
    params, opt = _named_fsdp_muon(world)
    changes = DIVERGENCES[case] if rank == odd_rank else {}
    if case == "gradient" and rank == odd_rank:
        params[1].grad = None
    with config.override(**changes):
        return _timed_step(torch.compile(opt.step, backend="muon"))


def diverge_after_compile(rank, world, mode, step2_timeout):
    """Compile and run one agreed step, then diverge: ``"skip"``, rank 1 skips step 2
    (waiting until rank 0 is done); ``"recompile"``, rank 0 alone recompiles (a guarded
    setting changed). Every rank returns how its step 2 ended and how long it took. Step 1
    runs under the process group's timeout and the default agreement timeout (on a loaded
    host one rank may reach the agreement, or finish compiling its kernels and wait in a
    collective, well before the other); step 2 under ``step2_timeout`` seconds and an
    agreement timeout of 3 s."""
    params, opt = _named_fsdp_muon(world)
    store = dist.distributed_c10d._get_default_store()
    step = torch.compile(opt.step, backend="muon")
    step()
    dist.barrier()
    for group in {dist.group.WORLD, params[0].device_mesh.get_group()}:
        dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=step2_timeout), group)
    with config.override(agree_timeout=3):
        if mode == "skip" and rank == 1:
            store.wait(["test/rank0_done"], datetime.timedelta(seconds=120))
            return "skipped", 0.0
        if mode == "recompile" and rank == 0:
            opt.param_groups[0]["nesterov"] = False
        outcome = _timed_step(step)
    if rank == 0:
        store.set("test/rank0_done", "1")
    return outcome


# skip_nonfinite on FSDP2: steps 0-2, step 1's gradient of the 24-row matrix NaN in row 20
# (rank 1's shard at W = 2); the reference takes steps 0 and 2 only.
SKIP_OPT = dict(lr=0.05, weight_decay=0.1, ns_dtype=torch.float32)


def _skip_grads(shapes, step):
    grads = step_grads(shapes, step)
    if step == 1:
        grads[0][20, 3] = float("nan")
    return grads


def fsdp_skip_nonfinite(rank, world):
    """Compiled MuonAdamW(skip_nonfinite=True) on an FSDP2 Stack: the full weights after
    the three steps and the skipped-step count."""
    shapes = FSDP_SHAPES
    params = sharded_stack(shapes, device_mesh(world))
    opt = muon_compile.Muon(params, skip_nonfinite=True, **SKIP_OPT)
    step = torch.compile(opt.step, backend="muon")
    for s in range(3):
        for p, g in zip(params, _skip_grads(shapes, s)):
            p.grad = distribute_like(g, p)
        step()
    return [p.full_tensor() for p in params], opt.skipped_steps.item()



def automatic_dynamic_run(rank, world, shapes, steps, opt_kw):
    """A Muon step compiled for other FSDP2 shapes first, then the same step code for
    ``shapes``: Dynamo recompiles it with dynamic shapes (automatic dynamic shapes), as for
    a user's second optimizer. Returns the full weights after ``steps`` steps of the second
    one, the warnings of its compile, its pass counters and whether its graph took symbolic
    sizes."""
    import warnings

    from torch.fx.experimental.symbolic_shapes import free_symbols

    from muon_compile.compile.backend import muon_backend

    mesh = device_mesh(world)
    other = [(rows + 1, cols + 1) for rows, cols in shapes]
    first = sharded_stack(other, mesh)
    set_step_grads(first, other, 0)
    torch.compile(muon_compile.Muon(first, **opt_kw).step, backend="muon")()
    params = sharded_stack(shapes, mesh)
    symbolic = []

    def backend(gm, example_inputs):  # notes whether a graph input's local tensor has a symbol
        inputs = (n.meta.get("example_value") for n in gm.graph.find_nodes(op="placeholder"))
        symbolic.append(any(free_symbols(getattr(v, "_local_tensor", v)) for v in inputs))
        return muon_backend(gm, example_inputs)

    step = torch.compile(muon_compile.Muon(params, **opt_kw).step, backend=backend)
    muon_compile.counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in range(steps):
            set_step_grads(params, shapes, s)
            step()
    return {
        "weights": [p.full_tensor() for p in params],
        "warnings": [str(w.message) for w in caught],
        "counters": dict(muon_compile.counters),
        "symbolic_inputs": any(symbolic),
    }


class TPBlock(nn.Module):
    """The projections of a small Llama-like block, bias-free, with sizes that the 2x2 mesh
    does not divide (5, 7 and 1 rows; 7 columns): q/k/v, the MLP's gate and up and a one-row
    head are column-parallel, the attention output and the MLP's down row-parallel."""

    COLWISE = {"q": (12, 10), "k": (6, 10), "v": (5, 10), "gate": (7, 10), "up": (7, 10), "head": (1, 10)}
    ROWWISE = {"o": (10, 12), "down": (10, 7)}

    def __init__(self):
        super().__init__()
        for name, (o, i) in {**self.COLWISE, **self.ROWWISE}.items():
            setattr(self, name, nn.Linear(i, o, bias=False))


TP_NAMES = list({**TPBlock.COLWISE, **TPBlock.ROWWISE})
TP_SHAPES = [{**TPBlock.COLWISE, **TPBlock.ROWWISE}[n] for n in TP_NAMES]


# expert stacks on a 2x2 (ep, tp) mesh: (shape, the dimension each mesh dimension shards, None:
# replicated) of column- and row-parallel experts, the third with experts, rows and columns
# that 2 does not divide, and a 2-D matrix beside them
EXPERT_LAYOUTS = [
    ((4, 12, 10), (0, 1)),
    ((4, 10, 7), (0, 2)),
    ((3, 5, 7), (0, 1)),
    ((10, 9), (None, 1)),
]


def expert_tp_muon(rank, world, steps, opt_kw, config_changes=None):
    """:data:`EXPERT_LAYOUTS` as DTensor parameters on a 2x2 (ep, tp) mesh, ``steps``
    compiled Muon steps with :func:`step_grads`. Returns the full weights, the pass counters
    and the post-pass graph's collectives."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ep", "tp"))
    shapes = [shape for shape, _ in EXPERT_LAYOUTS]
    placements = [[Replicate() if d is None else Shard(d) for d in dims] for _, dims in EXPERT_LAYOUTS]
    params = [nn.Parameter(distribute_tensor(w, mesh, pl, src_data_rank=None)) for w, pl in zip(initial_weights(shapes), placements)]
    opt = muon_compile.Muon(params, **opt_kw)
    with tempfile.TemporaryDirectory() as dump, config.override(dump_dir=dump, **(config_changes or {})):
        step = torch.compile(opt.step, backend="muon")
        for s in range(steps):
            for p, g, pl in zip(params, step_grads(shapes, s), placements):
                p.grad = distribute_tensor(g, mesh, pl, src_data_rank=None)
            step()
        graphs = dumped_graphs(dump)
    return {
        "weights": [p.full_tensor() for p in params],
        "counters": dict(muon_compile.counters),
        "collectives": collective_sequence(graphs.get("lower_after", "")),
    }


def blockwise_reference(steps, tp, **opt_kw):
    """:func:`reference_run` of :class:`TPBlock`'s matrices with each tensor-parallel block
    orthogonalised alone: the rows of a column-parallel weight, the columns of a row-parallel
    one, cut into ``tp`` pieces by ``torch.chunk`` as DTensor's ``Shard`` cuts them (a stack
    of equal shapes cut alike). The update's scale stays the whole matrix's."""
    from unittest import mock

    import muon_compile.optim.updates as updates

    rows_cut, cols_cut = set(TPBlock.COLWISE.values()), set(TPBlock.ROWWISE.values())
    assert not rows_cut & cols_cut, "a shape must say which way it is cut"
    whole = updates.newton_schulz_any

    def per_block(x, args, tp_mode=None):
        dim = -2 if tuple(x.shape[-2:]) in rows_cut else -1
        return torch.cat([whole(b, args) for b in x.chunk(tp, dim)], dim)

    with mock.patch.object(updates, "newton_schulz_any", per_block):
        return reference_run(TP_SHAPES, steps, **opt_kw)


def tp_block_model(mesh_shape=(2, 2)):
    """A :class:`TPBlock` with :func:`initial_weights`, parallelised with ``parallelize_module``
    on the ``tp`` dimension of a ``(dp, tp)`` mesh, then ``fully_shard`` on ``dp`` (on a
    ``(replicate, dp, tp)`` mesh of three sizes: HSDP on ``(replicate, dp)``):
    ``(model, weights in TP_NAMES order)``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    names = ("dp", "tp") if len(mesh_shape) == 2 else ("replicate", "dp", "tp")
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    model = TPBlock()
    with torch.no_grad():
        for name, w in zip(TP_NAMES, initial_weights(TP_SHAPES)):
            getattr(model, name).weight.copy_(w)
    plan = {**dict.fromkeys(TPBlock.COLWISE, ColwiseParallel()), **dict.fromkeys(TPBlock.ROWWISE, RowwiseParallel())}
    parallelize_module(model, mesh["tp"], plan)
    fully_shard(model, mesh=mesh[names[:-1]] if len(names) == 3 else mesh["dp"])
    return model, [getattr(model, name).weight for name in TP_NAMES]


def set_tp_grads(params, step):
    """Step ``step``'s global gradients of :data:`TP_SHAPES`, laid out as each weight is."""
    from torch.distributed.tensor import distribute_tensor

    for p, g in zip(params, step_grads(TP_SHAPES, step)):
        p.grad = distribute_tensor(g, p.device_mesh, p.placements, src_data_rank=None)


def tp_fsdp_muon(rank, world, steps, opt_kw, mesh_shape=(2, 2), config_changes=None, rank_opt_kw=None, optimizer="muon_compile",
                 names=TP_NAMES):
    """:func:`tp_block_model`; ``steps`` compiled Muon steps of the weights ``names`` with the
    gradients of :func:`set_tp_grads` (``rank_opt_kw``: ``{rank: options}`` that rank's optimizer
    takes on top of ``opt_kw``; ``optimizer``: :func:`make_optimizer`'s kind). Returns the full
    weights (of ``names``, in ``TP_NAMES`` order), the placements, the pass counters, the
    post-pass graph's collectives and the explanation (``MUON_COMPILE_EXPLAIN``'s reports)."""
    _, params = tp_block_model(mesh_shape)
    stepped = _named(params, names)
    opt = make_optimizer(optimizer, stepped, {**opt_kw, **(rank_opt_kw or {}).get(rank, {})})
    with tempfile.TemporaryDirectory() as dump, config.override(dump_dir=dump, **(config_changes or {})):
        step = torch.compile(opt.step, backend="muon")
        for s in range(steps):
            set_tp_grads(params, s)
            step()
        graphs = dumped_graphs(dump)
    return {
        "weights": [p.full_tensor() for p in stepped],
        "placements": [str(p.placements) for p in stepped],
        "counters": dict(muon_compile.counters),
        "collectives": collective_sequence(graphs.get("lower_after", "")),
        "explanation": "\n".join(str(r) for r in explain.reports()),
    }


def compile_step_run(rank, world, steps, opt_kw):
    """``muon_compile.Muon`` on a Stack of :data:`FSDP_SHAPES` stepped ``steps`` times through
    ``opt.step()`` under two schedulers (a ``LambdaLR`` built before
    :func:`muon_compile.compile_step`, a ``CosineAnnealingLR`` after): FSDP2-sharded over
    ``world`` gloo ranks and compiled, or (``world`` = 0) whole and eager in one process.
    Returns the full weights and the pass counters."""
    from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR

    if world:
        params = sharded_stack(FSDP_SHAPES, device_mesh(world))
    else:
        params = [nn.Parameter(w) for w in initial_weights(FSDP_SHAPES)]
    opt = make_optimizer("muon_compile", params, opt_kw)
    schedulers = [LambdaLR(opt, lambda i: 1.0 / (1 + i))]
    if world:
        muon_compile.compile_step(opt)
    schedulers.append(CosineAnnealingLR(opt, T_max=4))
    for s in range(steps):
        if world:
            set_step_grads(params, FSDP_SHAPES, s)
        else:
            for p, g in zip(params, step_grads(FSDP_SHAPES, s)):
                p.grad = g
        opt.step()
        for scheduler in schedulers:
            scheduler.step()
    return [p.full_tensor().clone() if world else p.detach() for p in params], dict(muon_compile.counters)

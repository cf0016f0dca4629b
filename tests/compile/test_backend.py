"""backend="muon" end to end: numerics against eager, no recompiles, the FX graph cache,
the entry point, Inductor options and pass switches."""

import textwrap

import pytest
import torch
import torch._functorch.config
from torch._dynamo.utils import counters as dynamo_counters
from torch._inductor.utils import fresh_cache

import muon_compile
from muon_compile import config

from helpers import MIXED_SHAPES, GraphCapture, bucket_count, compare_steps, make_params, muon, set_grads, step_and_compare
import script_runs
from numerics import NS_RTOL, assert_rel_close


def _sweep(ns_dtype, preset, nesterov):
    """One combination in the fast tier (the golden graphs check the default one), the rest slow."""
    fast = ns_dtype is torch.float32 and preset == "polar_express" and nesterov
    name = f"{'fp32' if ns_dtype is torch.float32 else 'bf16'}-{preset}-{'nesterov' if nesterov else 'plain'}"
    return pytest.param(ns_dtype, preset, nesterov, marks=() if fast else pytest.mark.slow, id=name)


# Half of the 2 x 2 x 2 combinations of dtype, preset and Nesterov: every value of each and
# every pair of values of any two occur (the fraction whose three factors' signs multiply
# to +1); each combination compiles for about 9 s.
_HALF_FRACTION = [
    (torch.float32, "polar_express", True),
    (torch.float32, "keller", False),
    (torch.bfloat16, "polar_express", False),
    (torch.bfloat16, "keller", True),
]


@pytest.mark.parametrize("ns_dtype, preset, nesterov", [_sweep(*combination) for combination in _HALF_FRACTION])
def test_compiled_matches_eager(device, ns_dtype, preset, nesterov):
    compare_steps(
        muon(lr=0.05, weight_decay=0.1, ns_dtype=ns_dtype, ns_coefficients=preset, nesterov=nesterov),
        MIXED_SHAPES,
        rtol=NS_RTOL[device][ns_dtype],
        device=device,
    )
    assert muon_compile.counters["bucket.buckets"] == bucket_count(MIXED_SHAPES, device, ns_dtype)


@pytest.mark.slow
def test_cycled_coefficient_set_compiles(device):
    # "quintic" cycles its five triples: 7 steps use triples 0-4, 0, 1
    compare_steps(muon(lr=0.05, ns_coefficients="quintic", ns_steps=7, ns_dtype="fp32"), MIXED_SHAPES, rtol=NS_RTOL[device][torch.float32], device=device)


@pytest.mark.slow
def test_normuon_and_cautious_weight_decay_compile(device):
    opt = muon(lr=0.05, weight_decay=0.3, normuon_beta2=0.95, cautious_weight_decay=True, ns_dtype="fp32")
    compare_steps(opt, MIXED_SHAPES, rtol=NS_RTOL[device][torch.float32], steps=3, device=device)
    assert muon_compile.counters["bucket.buckets"] == bucket_count(MIXED_SHAPES, device, torch.float32)  # NorMuon leaves them as they were


@pytest.mark.slow
def test_split_rows_blocks_join_the_buckets_of_their_shape(device):
    """A fused 24x8 QKV split into three 8x8 blocks and per-head 4x8 blocks of a 16x8 matrix
    join the 8x8 and 4x8 buckets of the plain matrices."""

    def make(params):
        return muon_compile.Muon(
            [
                {"params": params[:1], "split_rows": (8, 8, 8)},
                {"params": params[1:2], "split_rows": 4},
                {"params": params[2:]},
            ],
            lr=0.05,
            ns_dtype="fp32",
        )

    compare_steps(make, [(24, 8), (16, 8), (8, 8), (4, 8)], rtol=NS_RTOL[device][torch.float32], device=device)
    assert muon_compile.counters["bucket.buckets"] == 2  # 8x8 (3 blocks + 1), 4x8 (4 heads + 1)
    assert muon_compile.counters["bucket.matrices"] == 9  # 3 + 1 of 8x8, 4 + 1 of 4x8


@pytest.mark.slow
def test_bf16_params_and_adamw_groups_compile(device):
    def make(params):
        return muon_compile.MuonAdamW(
            [{"params": params[:-2], "kind": "muon"}, {"params": params[-2:], "kind": "adamw"}], weight_decay=0.01
        )

    compare_steps(make, MIXED_SHAPES[:4] + [(8,), ()], rtol=NS_RTOL[device][torch.bfloat16], dtype=torch.bfloat16, device=device)


def test_hyperparameter_changes_do_not_recompile_and_take_effect(device):
    shapes = MIXED_SHAPES[:4]
    eager_params, comp_params = make_params(shapes, device=device), make_params(shapes, device=device)
    eager, comp = muon_compile.Muon(eager_params, lr=0.02), muon_compile.Muon(comp_params, lr=0.02)
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in (eager, comp)]
    step = torch.compile(comp.step, backend="muon")
    dynamo_counters.clear()
    changes = [("momentum", 0.8), ("weight_decay", 0.3), ("lr", 0.07), None]
    for i, change in enumerate(changes):
        set_grads(eager_params, i)
        set_grads(comp_params, i)
        starts = [p.detach().clone() for p in eager_params + comp_params]
        eager.step()
        # the first call compiles; any later recompile raises RecompileError
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            step()
        # each step's update, not the whole parameters: a changed momentum, weight decay or lr
        # changes the update by far more than the bf16 tolerance, the parameters by less
        for j, (e, c) in enumerate(zip(eager_params, comp_params)):
            e0, c0 = starts[j], starts[len(eager_params) + j]
            assert_rel_close(c - c0, e - e0, NS_RTOL[device][torch.bfloat16], f"step {i} param {j}")
        for s in scheds:
            s.step()
        if change is not None:
            key, value = change
            for o in (eager, comp):
                o.param_groups[0][key].fill_(value)
    assert comp.param_groups[0]["lr"].item() == pytest.approx(0.035)
    assert dynamo_counters["stats"]["unique_graphs"] == 1  # the compile counter: one graph for all steps
    # the check above can fail: replacing the tensor by a Python float does recompile
    comp.param_groups[0]["lr"] = 0.01
    with pytest.raises(torch._dynamo.exc.RecompileError), torch._dynamo.config.patch(error_on_recompile=True):
        step()


@pytest.mark.slow
@pytest.mark.graph_cache
def test_fx_graph_cache_hits_on_second_compile(device):
    with fresh_cache():
        shapes = MIXED_SHAPES[:4]
        for attempt in range(2):
            torch._dynamo.reset()
            dynamo_counters.clear()
            muon_compile.counters.clear()
            compare_steps(muon(), shapes, rtol=NS_RTOL[device][torch.bfloat16], steps=1, device=device)
            if attempt == 0:
                assert dynamo_counters["inductor"]["fxgraph_cache_miss"] >= 1
                assert muon_compile.counters["bucket.buckets"] == bucket_count(shapes, device)
            else:
                assert dynamo_counters["inductor"]["fxgraph_cache_hit"] >= 1
                assert dynamo_counters["inductor"]["fxgraph_cache_miss"] == 0
                assert muon_compile.counters["bucket.buckets"] == 0  # passes skipped: the cache served it


@pytest.mark.slow
@pytest.mark.graph_cache
def test_config_change_misses_the_fx_graph_cache(device):
    with fresh_cache():
        compare_steps(muon(), MIXED_SHAPES[:4], rtol=NS_RTOL[device][torch.bfloat16], steps=1, device=device)
        torch._dynamo.reset()
        dynamo_counters.clear()
        with config.override(bucket_mb=0.001):
            compare_steps(muon(), MIXED_SHAPES[:4], rtol=NS_RTOL[device][torch.bfloat16], steps=1, device=device)
        assert dynamo_counters["inductor"]["fxgraph_cache_miss"] >= 1


@pytest.mark.slow
def test_entry_point_in_a_fresh_interpreter():
    code = textwrap.dedent(
        """
        import sys, torch
        assert "muon_compile" not in sys.modules
        f = torch.compile(lambda x: torch.sin(x) * 2, backend="muon")
        x = torch.randn(8)
        torch.testing.assert_close(f(x), torch.sin(x) * 2)
        assert "muon" in torch._dynamo.list_backends()
        print("ok")
        """
    )
    assert script_runs.python("-c", code, timeout=300).stdout.strip().endswith("ok")


class _RecordingPass(torch._inductor.custom_graph_pass.CustomGraphPass):
    """A user's post-grad pass: records what the graph holds when it runs."""

    def __init__(self, tag):
        self.tag = tag
        self.seen = []

    def __call__(self, graph):
        targets = [str(n.target) for n in graph.nodes if n.op == "call_function"]
        self.seen += [sum("newton_schulz" in t for t in targets), targets.count("aten.bmm.default") + targets.count("aten.baddbmm.default")]

    def uuid(self):
        return ("recording-pass", self.tag)


@pytest.mark.slow
@pytest.mark.graph_cache
def test_user_post_grad_pass_runs_after_ours_and_keys_the_cache(device):
    shapes = MIXED_SHAPES[:4]  # 3 buckets after bucketing, 5 iterations, 3 products each
    first, same, other = _RecordingPass("v1"), _RecordingPass("v1"), _RecordingPass("v2")

    def compile_with(user_pass):
        torch._dynamo.reset()
        dynamo_counters.clear()
        options = {"post_grad_custom_post_pass": user_pass, "max_fusion_buffer_group_pairwise_attempts": 4}
        # textbook: the count below is its three products per iteration (on CUDA, auto
        # picks the Gram iteration for two of these buckets, another count)
        compare_steps(
            muon(ns_algorithm="textbook"), shapes, rtol=NS_RTOL[device][torch.bfloat16], steps=1,
            options=options, device=device,
        )

    with fresh_cache():
        compile_with(first)
        buckets = bucket_count(shapes, device)
        assert first.seen == [0, buckets * 5 * 3]  # after lower: no NS op left, the lowered products present
        assert muon_compile.counters["bucket.buckets"] == buckets
        compile_with(same)
        assert dynamo_counters["inductor"]["fxgraph_cache_hit"] >= 1 and same.seen == []  # the cache served it
        compile_with([other])
        assert dynamo_counters["inductor"]["fxgraph_cache_miss"] >= 1 and other.seen == [0, buckets * 5 * 3]


@pytest.mark.slow
@pytest.mark.graph_cache
def test_plain_function_post_grad_pass_runs_and_bypasses_the_cache(device):
    seen = []
    dynamo_counters.clear()
    with fresh_cache():
        compare_steps(
            muon(), MIXED_SHAPES[:4], rtol=NS_RTOL[device][torch.bfloat16], steps=1, device=device,
            options={"post_grad_custom_post_pass": lambda graph: seen.append(len(graph.nodes))},
        )
    assert len(seen) == 1
    assert dynamo_counters["inductor"]["fxgraph_cache_bypass"] >= 1  # as Inductor does for a plain function
    with pytest.raises(ValueError, match="post_grad_custom_post_pass must be a callable"):
        from muon_compile.compile.backend import muon_backend

        muon_backend(torch.fx.symbolic_trace(lambda x: x + 1), [torch.randn(2)], options={"post_grad_custom_post_pass": 3})


@pytest.mark.slow
@pytest.mark.parametrize("passes", ["-bucket", "bucket", ""])
def test_passes_switch(device, passes):
    with config.override(passes=passes):
        compare_steps(muon(), MIXED_SHAPES, rtol=NS_RTOL[device][torch.bfloat16], steps=1, device=device)
    enabled = config.parse_passes(passes)
    assert (muon_compile.counters["bucket.buckets"] > 0) == ("bucket" in enabled)
    assert (muon_compile.counters["lower.ns_ops"] > 0) == ("lower" in enabled)


def test_unknown_pass_name_is_rejected():
    with pytest.raises(ValueError, match="unknown pass"):
        config.parse_passes("-bucketing")


def test_strategy_is_one_enum_in_the_configuration():
    assert config.from_env({}).strategy is config.Strategy.ALL_TO_ALL
    assert config.from_env({"MUON_COMPILE_STRATEGY": "all_gather"}).strategy is config.Strategy.ALL_GATHER
    with pytest.raises(ValueError, match=r"MUON_COMPILE_STRATEGY must be one of \['all_to_all', 'all_gather'\], got 'auto'"):
        config.from_env({"MUON_COMPILE_STRATEGY": "auto"})
    with config.override(strategy="all_gather") as cfg:
        assert cfg.strategy is config.Strategy.ALL_GATHER



def test_a_dump_directory_that_cannot_be_one_fails_where_it_is_read(tmp_path):
    """MUON_COMPILE_DUMP_DIR is made when the setting is read; a file there or in its path,
    or a folder where none can be made, is a ValueError naming the variable, not an error in
    the first compile."""
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(ValueError, match=r"MUON_COMPILE_DUMP_DIR='.*a_file' is a file, not a directory"):
        config.from_env({"MUON_COMPILE_DUMP_DIR": str(a_file)})
    with pytest.raises(ValueError, match=r"MUON_COMPILE_DUMP_DIR='.*a_file/below'.* cannot be created \(Not a directory\)"):
        config.from_env({"MUON_COMPILE_DUMP_DIR": str(a_file / "below")})
    with pytest.raises(ValueError, match=r"MUON_COMPILE_DUMP_DIR='/proc/forbidden'.* cannot be created"):
        config.from_env({"MUON_COMPILE_DUMP_DIR": "/proc/forbidden"})
    with pytest.raises(ValueError, match="MUON_COMPILE_DUMP_DIR"):
        with config.override(dump_dir=str(a_file)):
            pass
    made = tmp_path / "new" / "dumps"
    assert config.from_env({"MUON_COMPILE_DUMP_DIR": str(made)}).dump_dir == str(made) and made.is_dir()


def test_the_suite_runs_without_the_machines_settings():
    """tests/conftest.py removed every MUON_COMPILE_* variable and Triton's interpreter
    switch, so the suite compiles what it says whatever the machine sets, and pinned the
    CPU's matmul rates to the reference profile, so it plans alike on every CPU."""
    import os

    settings = [name for name in os.environ if name.startswith("MUON_COMPILE_") or name == "TRITON_INTERPRET"]
    assert settings == ["MUON_COMPILE_CPU_RATES"] and os.environ["MUON_COMPILE_CPU_RATES"] == "cpu"
    assert config.current() == config.Config(cpu_rates="cpu") and torch.get_num_threads() == 2


def test_tp_mode_is_parsed_and_validated_where_it_is_given():
    assert config.from_env({"MUON_COMPILE_TP_MODE": "blockwise", "MUON_COMPILE_TP_DIMS": "tp, etp"}).tp_dims == ("tp", "etp")
    assert config.from_env({"MUON_COMPILE_TP_MODE": "blockwise"}).tp_mode is config.TPMode.BLOCKWISE
    with pytest.raises(ValueError, match=r"MUON_COMPILE_TP_MODE must be one of \['distributed', 'duplicated', 'blockwise'\], got 'split'"):
        config.from_env({"MUON_COMPILE_TP_MODE": "split"})
    with pytest.raises(ValueError, match=r"^tp_mode must be one of .*got 'split'"):
        muon_compile.Muon(make_params(MIXED_SHAPES[:1]), tp_mode="split")
    assert muon_compile.Muon(make_params(MIXED_SHAPES[:1]), tp_mode="duplicated").param_groups[0]["tp_mode"] == "duplicated"


def test_dynamic_true_is_rejected_naming_the_fix():
    """``dynamic=True`` makes the optimizer's Python numbers symbolic, the Newton–Schulz
    coefficients among them: the backend refuses with the fix in the message. (Symbolic
    shapes alone are compiled: test_distributed's automatic dynamic shapes test.)"""
    params = make_params(MIXED_SHAPES[:2])
    set_grads(params, 0)
    step = torch.compile(muon_compile.Muon(params, lr=0.05).step, backend="muon", dynamic=True)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=r"coefficients .* are symbolic.*dynamic=False"):
        step()


def test_a_step_with_float64_hyperparameters_is_traced_once(monkeypatch):
    """Dynamo restarts the analysis of a frame whose 0-D float64 inputs have an unused
    ``.item()`` symbol (muon_compile.compile.tensorify); the backend marks those first, so the
    step of an optimizer with float64 hyper-parameters is traced and compiled once."""
    import muon_compile.compile.backend as backend

    compiles = []
    real = backend.compile_fx
    monkeypatch.setattr(backend, "compile_fx", lambda *args, **kw: compiles.append(1) or real(*args, **kw))
    params = make_params([(8, 12), (12, 8)])
    opt = muon_compile.Muon(params, ns_dtype=torch.float32)
    assert opt.param_groups[0]["lr"].dtype == torch.float64
    set_grads(params, 0)
    torch.compile(opt.step, backend="muon")()
    assert len(compiles) == 1


def test_an_item_the_graph_takes_is_left_to_torch():
    """Only symbols no node uses are marked: a graph that reads ``s.item()`` keeps its own."""
    from muon_compile.compile import tensorify

    capture = GraphCapture()
    p, s = torch.ones(4), torch.tensor(0.5, dtype=torch.float64)
    for fn in (lambda p, s: p * s, lambda p, s: p * s.item()):
        torch._dynamo.reset()
        torch.compile(fn, backend=capture)(p, s)
    assert [tensorify.mark_unused_items(gm) for gm in capture.graphs] == [1, 0]


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_unmodified_torch_muon_with_a_float_lr_under_a_scheduler(weight_decay):
    """torch.optim.Muon as published (a Python-float lr, ``add_(u, alpha=-lr)``) under a
    cosine schedule, 12 steps, each update equal to eager's: from torch 2.13 two graphs (the
    first value, then the lr as an input: muon_compile.compile.tensorify.alpha_as_product), where
    they were 8 and then eager; torch 2.11 recompiles at every change (compat), and the
    backend warns at the first. With weight decay, torch 2.13's AOTAutograd cache once kept
    the lr of the recompile: the updates here would then drift from eager's."""
    from muon_compile.compile.compat import DYNAMO_SPECIALIZES_FLOATS

    shapes = [(8, 12), (12, 8)]
    eager_params, params = make_params(shapes), make_params(shapes)
    eager, opt = (torch.optim.Muon(p, lr=0.02, weight_decay=weight_decay) for p in (eager_params, params))
    step = torch.compile(opt.step, backend="muon")  # before the schedulers wrap opt.step
    schedules = [torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10) for o in (eager, opt)]
    dynamo_counters.clear()
    with torch._inductor.config.patch(fx_graph_cache=True), torch._functorch.config.patch(enable_autograd_cache=True):
        for s in range(12):
            step_and_compare(eager_params, params, eager, opt, step, s, NS_RTOL["cpu"][torch.bfloat16], f"step {s}")
            for schedule in schedules:
                schedule.step()
    graphs = dynamo_counters["stats"]["unique_graphs"]
    assert graphs == (8 if DYNAMO_SPECIALIZES_FLOATS else 2), graphs


def test_a_float_alpha_made_a_product_scales_in_the_sums_dtype(monkeypatch):
    """``p.add_(u, alpha=-lr)`` with a bf16 ``u`` and a Python-float ``lr`` that changes: from
    the second compile ``lr`` is an input and ``alpha`` a product (tensorify.alpha_as_product),
    taken in the sum's fp32 as ``alpha`` is: the compiled parameters equal eager's to 2 ulps.
    The product in ``u``'s bf16 (as once) rounded every update to bf16 again: up to 1e-4 off."""
    from muon_compile.compile import tensorify
    from muon_compile.compile.compat import DYNAMO_SPECIALIZES_FLOATS

    rewritten = []
    original = tensorify.alpha_as_product
    monkeypatch.setattr(tensorify, "alpha_as_product", lambda gm: rewritten.append(original(gm)) or rewritten[-1])

    def write(p, u, lr):
        p.add_(u, alpha=-lr)

    gen = torch.Generator().manual_seed(0)
    u = torch.randn(64, 64, generator=gen).bfloat16()
    start = 1 + torch.rand(64, 64, generator=gen)  # in [1, 2): one ulp is 2^-23
    step = torch.compile(write, backend="muon")
    for lr in (0.02, 0.0173, 0.0311):
        compiled, eager = start.clone(), start.clone()
        step(compiled, u, lr)
        write(eager, u, lr)
        assert (compiled - eager).abs().max() <= 2 * 2.0**-23, lr
    assert DYNAMO_SPECIALIZES_FLOATS or 1 in rewritten, rewritten  # the symbolic lr's graph took the product


def test_inductors_first_fallback_to_an_op_formats_its_arguments_only_when_read():
    """torch 2.11 / 2.12 (``compat.lazy_fallback_log``): Inductor's text of the arguments of an
    op it first falls back to is made when read, not for an INFO line that is not logged (the
    stacks' write's source, a bucket's last product, has a text 8-fold longer per Newton–Schulz
    iteration). 2.13 and later make it lazily themselves."""
    from torch._inductor.exc import OperatorIssue

    from muon_compile.compile import backend, compat  # noqa: F401 - the backend patches on import

    if not compat.EAGER_FALLBACK_LOG:
        pytest.skip(f"torch {torch.__version__} formats the fallback's log line lazily itself")
    reads = []

    class Argument:
        def __str__(self):
            reads.append(self)
            return "an argument"

    text = OperatorIssue.operator_str("an op", [Argument()], {})
    assert reads == []
    assert str(text) == "  target: an op\n  args[0]: an argument" and len(reads) == 1

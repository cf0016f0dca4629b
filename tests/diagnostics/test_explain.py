"""Telling the user what happened: setting reads and logging calls traced into one graph
(and the switch that turns that off), the warning for a Python-float lr that recompiles
the step, and the explanation of each compiled graph (MUON_COMPILE_EXPLAIN=1 and
muon_compile.diagnostics.explain.explain)."""

import contextlib
import inspect
import logging
import re
import warnings

import pytest
import torch
from absl import logging as absl_logging
from torch._dynamo.utils import counters as dynamo_counters

import muon_compile
from muon_compile import config
from muon_compile.diagnostics import explain
from muon_compile.compile import tracing
from muon_compile.compile.compat import (
    DYNAMO_DROPS_YIELD_FROM_RETURN,
    DYNAMO_FAILS_ON_YIELD_FROM_RETURN,
    DYNAMO_SORTS_CONFIG_SETS,
)
from muon_compile.passes.canonicalize.apply import plan_canonical

import ns_forms
from helpers import GraphCapture, compare_steps, make_params, muon, set_grads
from muon_corpus import CORPUS
from numerics import NS_RTOL
from muon_corpus import SHAPES, corpus_shapes, dynamo_graphs


@contextlib.contextmanager
def tracing_helpers(enabled):
    was = tracing.installed()
    tracing.install(enabled)
    try:
        yield
    finally:
        tracing.install(was)


def _line_of(fn, text):
    """``file:line`` of the first line of ``fn``'s source containing ``text``."""
    lines, first = inspect.getsourcelines(fn)
    (offset,) = [i for i, line in enumerate(lines) if text in line][:1]
    return f"{inspect.getsourcefile(fn)}:{first + offset}"


# ------------------------------------------------------------- point 4: one graph

@pytest.mark.skipif(DYNAMO_SORTS_CONFIG_SETS, reason="torch < 2.13: logging calls are left to break the graph")
def test_logging_and_setting_reads_trace_into_one_graph_and_can_be_switched_off():
    """Megatron's Muon as released logs around its loop and sets and reads the matmul precision
    inside the step: one graph with the helpers; several graphs without them."""
    entry = CORPUS["emerging_optimizers_absl"]
    assert len(dynamo_graphs(entry, SHAPES)) == 1
    torch._dynamo.reset()
    with tracing_helpers(False):
        assert len(dynamo_graphs(entry, SHAPES)) == 18  # Dynamo splits the step around every call it cannot trace


_LOG = logging.getLogger("muon_compile.tests.step")


def _logs_inside(x):
    """A helper Dynamo inlines, logging as released Muon code does (Emerging-Optimizers' absl
    ``log_first_n`` in its Newton–Schulz function) and at every level and through every kind of call."""
    absl_logging.log_first_n(absl_logging.WARNING, "absl first only", 1)
    absl_logging.warning("absl warning %s", "args")
    _LOG.warning("logger %s", "warning")
    _LOG.log(logging.ERROR, "logger log")
    _LOG.info("logger info, below the level")
    warnings.warn("a warning in the step")
    return x * 2


def _logging_step(x):
    logging.warning("module function %s", "warning")
    return _logs_inside(x) + 1


@contextlib.contextmanager
def _logging_from_fresh(caplog, level):
    """Records at ``level`` and above into ``caplog``, absl's verbosity ``level`` and its counts
    fresh: absl counts ``log_first_n`` by calling line, once for the process, so a run after
    another of the same lines would log less."""
    from absl.logging import _log_counter_per_token

    caplog.clear()
    _log_counter_per_token.clear()
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(level)
    try:
        with caplog.at_level(level):
            yield
    finally:
        absl_logging.set_verbosity(verbosity)


def _messages(step, caplog, steps=3):
    """What ``steps`` calls of ``step`` log and warn, in order."""
    with _logging_from_fresh(caplog, logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            step(torch.ones(3))
    return [r.getMessage() for r in caplog.records], [str(w.message) for w in caught]


@pytest.mark.skipif(DYNAMO_SORTS_CONFIG_SETS, reason="torch < 2.13: logging calls are left to break the graph")
def test_logging_calls_in_a_step_are_made_after_its_graph_as_eager_code_makes_them(caplog):
    """Every logging call of a step, in a function Dynamo inlines too, is made after its one
    graph, each time it runs, in the order eager code makes them; absl's ``log_first_n``
    once in all; a message below the logger's level not at all, as in eager code."""
    eager = _messages(_logging_step, caplog)
    compiled = _messages(torch.compile(_logging_step, backend="eager", fullgraph=True), caplog)
    assert eager[0].count("absl first only") == 1 and eager[0].count("logger log") == 3, eager
    assert "logger info, below the level" not in eager[0]
    assert compiled == eager


@pytest.mark.skipif(DYNAMO_SORTS_CONFIG_SETS, reason="torch < 2.13: logging calls are left to break the graph")
def test_a_logging_call_with_keyword_arguments_splits_the_step_and_is_made_in_place(caplog):
    """Dynamo would make a reordered call without its keyword arguments: such a call splits
    the step instead (the reason names it), and runs eagerly, as written."""

    def step(x):
        _LOG.warning("with %s", "keywords", stacklevel=1)
        return x + 1

    dynamo_counters.clear()
    assert _messages(torch.compile(step, backend="eager"), caplog)[0] == ["with keywords"] * 3
    assert any("logging call with keyword arguments" in reason for reason in dynamo_counters["graph_break"])


@pytest.mark.skipif(DYNAMO_SORTS_CONFIG_SETS, reason="torch < 2.13: logging calls are left to break the graph")
def test_logging_calls_split_the_step_without_the_helpers(caplog):
    """The switch: without the tracing helpers Dynamo splits the step at each call (absl's
    ``log_first_n`` reads its caller's frame), and the messages are still made eagerly."""
    with tracing_helpers(False):
        dynamo_counters.clear()
        messages = _messages(torch.compile(_logging_step, backend="eager"), caplog)
        assert sum(dynamo_counters["graph_break"].values()) > 1, dict(dynamo_counters["graph_break"])
    assert messages == _messages(_logging_step, caplog)


def _emerging_messages(step, params, caplog, steps=2):
    """What ``steps`` calls of a corpus step log at INFO and above, in order, with the line each
    record names."""
    with _logging_from_fresh(caplog, logging.INFO), torch.no_grad():
        for seed in range(steps):
            set_grads(params, 100 + seed)
            step()
    return [(r.getMessage(), r.pathname, r.lineno) for r in caplog.records]


@pytest.mark.skipif(DYNAMO_SORTS_CONFIG_SETS, reason="torch < 2.13: logging calls are left to break the graph")
def test_emerging_optimizers_as_released_logs_from_one_recognised_graph(caplog):
    """tests/support/published/emerging_optimizers_absl.py with its released default, "medium" fp32
    matmul precision set inside the step and read by the Newton–Schulz function, which then
    logs ``log_first_n(INFO, ..., 1)`` and, asked for SYRK on a shape that is not 16-byte
    aligned, ``log_first_n(ERROR, ..., 8, shape)``: one graph, both loops recognised, the
    messages eager code gives, each naming the line that logs it. Without the helpers (main before 220d5be, as the released package
    was) the step splits at the calls and no loop is recognised."""
    shapes = [(24, 12), (12, 12)]  # 12 columns of bf16: not 16-byte aligned, so the SYRK choice logs
    entry = CORPUS["emerging_optimizers_absl"]

    def make(params):
        return entry.make(params, entry.dtype, use_syrk=True)

    def compiled_run(helpers):
        params = make_params(shapes)
        capture = GraphCapture()
        torch._dynamo.reset()
        with tracing_helpers(helpers):
            messages = _emerging_messages(torch.compile(make(params), backend=capture), params, caplog)
        return capture.graphs, messages

    params = make_params(shapes)
    eager = _emerging_messages(make(params), params, caplog)
    texts = [text for text, _, _ in eager]
    skipped = [t for t in texts if t.startswith("[SYRK-SKIP] skipping SYRK for shape (12, 24)")]
    assert len(skipped) == 2 and texts.count("Using BF16 I/O kernels for Newton-Schulz iteration.") == 1, eager
    assert {path for _, path, _ in eager} == {inspect.getsourcefile(entry.make)}
    graphs, messages = compiled_run(True)
    assert len(graphs) == 1 and messages == eager, (len(graphs), messages)
    assert len(plan_canonical(graphs[0].graph)[0]) == len(shapes)
    graphs, messages = compiled_run(False)
    assert len(graphs) > 1 and messages == eager, len(graphs)
    assert sum(len(plan_canonical(gm.graph)[0]) for gm in graphs) == 0


def test_a_setting_read_while_tracing_is_guarded():
    """The setting is read at trace time and guarded: changing it recompiles, so the step
    follows it (never a stale value)."""

    def step(x):
        return x * 2 if torch.get_float32_matmul_precision() == "highest" else x * 3

    compiled = torch.compile(step, backend="eager", fullgraph=True)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert compiled(torch.ones(2)).tolist() == [2.0, 2.0]
        torch.set_float32_matmul_precision("high")
        assert compiled(torch.ones(2)).tolist() == [3.0, 3.0]
    finally:
        torch.set_float32_matmul_precision(before)


def _orthogonalized(x):
    """A sub-generator that returns its result without yielding (Dion's single-device branch)."""
    if x is None:
        yield
    return [x * 2]


def _task(x, out):
    u = yield from _orthogonalized(x)
    out.append(u[0] + 1)


def _generator_step(x):
    """The task driven by ``next`` as Dion's runtime drives it (a ``for`` loop over it is
    traced another way, which always kept the value)."""
    out = []
    task = _task(x, out)
    try:
        next(task)
    except StopIteration:
        pass
    return out[0]


def test_a_value_returned_through_yield_from_is_traced_in_one_graph():
    """``u = yield from g()`` is g's return value in the traced step, as in eager code; without
    the helpers torch 2.13's Dynamo makes it None and splits the step at its first use, and
    2.11's fails the compile."""
    x = torch.arange(3.0)
    torch._dynamo.reset()
    compiled = torch.compile(_generator_step, backend="eager", fullgraph=True)
    assert compiled(x).tolist() == _generator_step(x).tolist() == [1.0, 3.0, 5.0]
    torch._dynamo.reset()
    with tracing_helpers(False):
        compiled = torch.compile(_generator_step, backend="eager", fullgraph=True)
        if DYNAMO_DROPS_YIELD_FROM_RETURN:
            failure = "Cannot construct `ConstantVariable`" if DYNAMO_FAILS_ON_YIELD_FROM_RETURN else "'NoneType' object is not subscriptable"
            with pytest.raises(Exception, match=failure):  # 2.11: AssertionError, 2.13: Unsupported
                compiled(x)
        else:
            assert compiled(x).tolist() == [1.0, 3.0, 5.0]


def test_dion_as_released_steps_in_one_recognised_graph():
    """tests/support/published/dion_megabatch.py (Dion's Muon at 0a059a4: each same-shape group a
    generator task whose orthogonalised list comes back through ``yield from``): one graph,
    every group's loop recognised. Without the helpers (main before this test, as the released
    code meets it) torch 2.13 splits each group's update from the rest at
    ``_foreach_mul(U, adjusted_lr)`` and recognises no loop; torch 2.11 fails the compile."""
    entry = CORPUS["dion_megabatch"]
    shapes = corpus_shapes(entry)  # two matrices of each shape: each group stacked
    torch._dynamo.reset()
    graphs = dynamo_graphs(entry, shapes)
    assert len(graphs) == 1
    assert len(plan_canonical(graphs[0].graph)[0]) == entry.loops(shapes)
    torch._dynamo.reset()
    with tracing_helpers(False):
        if DYNAMO_FAILS_ON_YIELD_FROM_RETURN:
            with pytest.raises(AssertionError, match="Cannot construct `ConstantVariable`"):
                dynamo_graphs(entry, shapes)
            return
        graphs = dynamo_graphs(entry, shapes)
    if DYNAMO_DROPS_YIELD_FROM_RETURN:
        assert len(graphs) == 11, len(graphs)
        assert sum(len(plan_canonical(gm.graph)[0]) for gm in graphs) == 0
    else:
        assert len(graphs) == 1

# ------------------------------------------------------- point 5: the float-lr warning

def _scheduled_steps(lr, steps=5):
    """``steps`` compiled steps of torch.optim.Muon with ``lr`` and a cosine schedule; the
    warnings the backend raised."""
    params = make_params([(8, 12), (12, 8)])
    opt = torch.optim.Muon(params, lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    step = torch.compile(opt.step, backend="muon")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in range(steps):
            set_grads(params, s)
            step()
            sched.step()
    return [str(w.message) for w in caught if "muon_compile" in str(w.message)]


@pytest.mark.slow
def test_a_float_lr_that_recompiles_the_step_warns_once_naming_the_fix():
    # Dynamo's automatic dynamic numbers off: every lr change recompiles, on every torch
    # (what torch 2.11 does by default)
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        messages = _scheduled_steps(0.02)
        assert len(messages) == 1, messages
        assert "param_groups[0]['lr']" in messages[0] and "lr=torch.tensor(" in messages[0]
        # counted per compiled frame: after a reset (a new process, as far as Dynamo knows)
        # the step warns again, whatever recompiled before (once not, in CI's whole suite)
        torch._dynamo.reset()
        assert len(_scheduled_steps(0.02)) == 1


@pytest.mark.slow
def test_a_tensor_lr_compiles_once_and_does_not_warn():
    from torch._dynamo.utils import counters

    counters.clear()
    assert _scheduled_steps(torch.tensor(0.02)) == []
    assert counters["stats"]["unique_graphs"] == 1


def test_a_cuda_graph_asked_for_on_the_cpu_warns_once_and_runs_without(monkeypatch):
    """mode="reduce-overhead" (Inductor's CUDA graphs) on a CPU step: one warning naming the
    device, the step compiled and equal to eager, and no second warning for another graph."""
    monkeypatch.setattr(explain, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compare_steps(muon(ns_dtype=torch.float32), [(8, 12)], rtol=NS_RTOL["cpu"][torch.float32], steps=1, mode="reduce-overhead")
        compare_steps(muon(ns_dtype=torch.float32), [(12, 8)], rtol=NS_RTOL["cpu"][torch.float32], steps=1, mode="reduce-overhead")
    messages = [str(w.message) for w in caught if "CUDA graph" in str(w.message)]
    assert len(messages) == 1, messages
    assert "on cpu, not CUDA" in messages[0] and "runs without one" in messages[0]


# ------------------------------------------------------------ point 6: the explanation

def _forms(Ws, Gs):
    """Two recognised loops (one bucket) and a near miss, each result applied to a weight."""
    for W, G, form in zip(Ws, Gs, [ns_forms.keller, ns_forms.keller, ns_forms.septic]):
        W.sub_(0.1 * form(G))


def _weights_and_grads():
    return [torch.randn(8, 12) for _ in range(3)], [torch.randn(8, 12) for _ in range(3)]


@pytest.mark.slow
def test_explain_names_each_loop_its_line_its_verdict_and_the_buckets():
    (report,) = explain.explain(_forms, *_weights_and_grads())
    text = str(report)
    assert f"loop at {_line_of(ns_forms.keller, 'X.norm(')} in keller: recognised: newton_schulz(5 steps" in text
    assert f"loop at {_line_of(ns_forms.septic, 'X.norm(')} in septic: NOT recognised: step 0 is a polynomial of degree 3" in text
    assert re.search(r"bucket 0: 2 x 8x12 torch.bfloat16 .* sites \[0, 1\]", text), text
    assert report.graph_breaks == [] and report.recompile_reason is None


def test_explain_names_a_loop_the_walk_never_started():
    """A loop whose input went through a custom rounding, never normalised, forms no
    candidate; the explanation names it at its first Gram product, with what stopped it."""

    def rounded(W, G):
        W.sub_(0.1 * ns_forms.rounded_unnormalised(G).float())

    (report,) = explain.explain(rounded, torch.randn(8, 12), torch.randn(8, 12))
    text = str(report)
    line = _line_of(ns_forms._keller_steps, "A = X @ X.mT")
    assert f"loop at {line} in _keller_steps: NOT recognised: a loop of Gram products whose input passes " in text, text
    assert "integer values" in text and muon_compile.counters["canonicalize.unseen"] == 1


@pytest.mark.slow
def test_explain_env_prints_each_graph_as_it_compiles(capsys):
    with config.override(explain=True):
        torch.compile(_forms, backend="muon")(*_weights_and_grads())
    out = capsys.readouterr().out
    assert out.startswith("muon_compile: graph [0/0]")
    assert out.count(": recognised") == 2 and out.count("NOT recognised") == 1 and "bucket 0: 2 x 8x12" in out


def test_explain_reports_graph_breaks_and_recompiles():
    """A graph break splits a loop (so it is not seen whole); a recompile says why."""

    def broken(G):
        X = G / (G.norm() + 1e-7)
        A = X @ X.mT
        torch._dynamo.graph_break()
        return 3.4445 * X + (-4.775 * A + 2.0315 * A @ A) @ X

    with config.override(passes="canonicalize"):
        reports = explain.explain(broken, torch.randn(8, 12))
    assert len(reports) == 2
    assert reports[0].graph_breaks == ["Call to `torch._dynamo.graph_break()`"]
    assert "ends at a graph break: Call to `torch._dynamo.graph_break()`" in str(reports[0])
    assert "NOT recognised: a Gram matrix is read by output" in str(reports[0])  # the split loop
    assert reports[1].graph_breaks == [] and "recompiled because" not in str(reports[0])

    compiled = torch.compile(lambda x, k: x * k, backend="muon")
    compiled(torch.ones(2), 2)
    compiled(torch.ones(2), 3)
    assert "recompiled because" in str(explain.reports()[-1])


def _one_loop(G):
    return ns_forms.keller(G, steps=2)


def _iteration(X, a, b, c):
    A = X @ X.mT
    return a * X + (b * A + c * A @ A) @ X


def _skipped_newton_schulz(G):
    """Emerging-Optimizers' shape: the iteration a helper picked by ndim, called once a row."""
    X = G / G.norm()
    iteration = _iteration if X.ndim == 2 else _iteration
    for a, b, c in [ns_forms.KELLER] * 2:
        torch._dynamo.graph_break()  # in the loop: Dynamo skips the whole function
        X = iteration(X, a, b, c)
    return X


def test_explain_names_a_loop_that_runs_in_a_function_dynamo_skipped():
    """A Newton–Schulz loop inside a function Dynamo runs eagerly after a split never reaches
    the backend: the graphs compiled beneath it (the helper's) name the split, the function
    and the loop's line, its products made through a helper bound to a local name."""
    here = inspect.getsourcefile(_skipped_newton_schulz)
    first = inspect.getsourcelines(_skipped_newton_schulz)[1]
    with config.override(passes="canonicalize"):
        reports = explain.explain(_skipped_newton_schulz, torch.randn(8, 12))
    assert reports and all(
        f"at {here}:{first + 5}, so Dynamo runs _skipped_newton_schulz eagerly; its loop of matrix products at "
        f"{here}:{first + 4} runs uncompiled, not bucketed" in str(r) for r in reports
    ), [str(r) for r in reports]


def test_explain_names_the_split_that_leaves_a_recognised_loop_alone():
    """A recognised loop alone in its graph, because the step is split around it, is
    reported "recognised, not bucketed: the step is split by <reason> at <file>:<line>":
    a graph break the graph ends at or resumes after, or a caller Dynamo skipped (a graph
    break in a loop: DeePMD-kit's ``sorted(key=data_ptr)``), which then runs eagerly."""

    def broken(G, H):
        W = _one_loop(G)
        torch._dynamo.graph_break()
        return W, _one_loop(H)

    def sorted_by_address(Gs):
        out = []
        for group in [Gs]:
            group.sort(key=lambda t: t.data_ptr())
            out += [_one_loop(G) for G in group]
        return out

    here = inspect.getsourcefile(test_explain_names_the_split_that_leaves_a_recognised_loop_alone)
    line = {key: inspect.getsourcelines(fn)[1] + offset for key, fn, offset in
            (("break", broken, 2), ("sort", sorted_by_address, 3))}
    with config.override(passes="canonicalize"):
        first, second = explain.explain(broken, torch.randn(8, 12), torch.randn(8, 12))
        skipped = explain.explain(sorted_by_address, [torch.randn(8, 12), torch.randn(8, 12)])
    assert f"recognised, not bucketed: the step is split by a graph break (" in str(first)
    assert f"at {here}:{line['break']}, where this graph ends" in str(first)
    assert (f"recognised, not bucketed: the step is split by a graph break at {here}:{line['break']} in broken, "
            f"after which this graph resumes") in str(second)
    assert skipped and all(
        f"recognised, not bucketed: the step is split by " in str(r) and f"at {here}:{line['sort']}, so Dynamo runs "
        f"sorted_by_address eagerly" in str(r) for r in skipped
    ), [str(r) for r in skipped]
    # loops of an unsplit step are not reported as split
    assert "split" not in str(explain.explain(lambda a, b: (_one_loop(a), _one_loop(b)), torch.randn(8, 12), torch.randn(8, 12))[0])

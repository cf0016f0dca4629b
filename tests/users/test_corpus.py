"""The corpus of public Muon implementations (tests/support/muon_corpus.py): every entry's
Newton–Schulz loop is recognised, one op per loop, bucketed, and its compiled step equals
eager execution of the same code, and is as accurate as eager against the exact (fp64)
evaluation of that code."""

import pytest
import torch
from torch._dynamo.utils import counters as dynamo_counters

import muon_compile
from muon_compile.compile.compat import DYNAMO_SORTS_CONFIG_SETS
from muon_compile.passes.canonicalize.apply import plan_canonical
from muon_compile.passes.canonicalize.near_miss import unseen_loops

from helpers import GraphCapture, bucket_count, make_params, set_grads
from muon_corpus import CORPUS, corpus_shapes, dynamo_graphs, run_entry
from numerics import assert_rewrite_close

RECOGNISED = [name for name, entry in CORPUS.items() if entry.today is None]
NOT_YET = [name for name, entry in CORPUS.items() if entry.today is not None]


def corpus_entry(name):
    """The entry, skipped where this torch cannot trace it in one graph."""
    entry = CORPUS[name]
    if entry.logs_in_loop and DYNAMO_SORTS_CONFIG_SETS:
        pytest.skip("torch < 2.13: a logging call in the loop breaks the graph (compat.DYNAMO_SORTS_CONFIG_SETS)")
    return entry


def _planned(name):
    """The parameter of an entry's planning test: a strict expected failure for one not yet recognised."""
    today = CORPUS[name].today
    return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=today) if today else ())


@pytest.mark.parametrize("name", [_planned(name) for name in CORPUS])
def test_entry_is_planned_as_one_match_per_loop(name):
    """The recogniser's verdict on Dynamo's graphs of the step, without compiling: one
    match per loop, nothing rejected, the step in one graph."""
    entry = corpus_entry(name)
    shapes = corpus_shapes(entry)
    graphs = dynamo_graphs(entry, shapes)
    matches, rejected = [], []
    for gm in graphs:
        m, r = plan_canonical(gm.graph)
        matches += m
        rejected += r
    assert not rejected, [r.reason for r in rejected]
    assert len(matches) == entry.loops(shapes)
    assert len(graphs) == 1, f"{len(graphs)} graphs"


@pytest.mark.slow
@pytest.mark.parametrize("name", RECOGNISED)
def test_entry_compiles_to_buckets_and_matches_eager(name, device):
    entry = corpus_entry(name)
    shapes = corpus_shapes(entry)
    start = [p.detach() for p in make_params(shapes, device=device)]
    dynamo_counters.clear()
    got = run_entry(entry, shapes, backend="muon", device=device)
    # a step that makes its state on the first call, or counts steps in a Python int, compiles
    # a second graph at the second step (then no more: Entry.graphs); each graph has every loop
    graphs = dynamo_counters["stats"]["unique_graphs"]
    assert graphs == entry.graphs, graphs
    loops = entry.loops(shapes)
    assert muon_compile.counters["canonicalize.matched"] == loops * graphs
    assert muon_compile.counters["canonicalize.rejected"] == 0
    assert muon_compile.counters["find.ns_ops"] == loops * graphs
    seen = [(min(s[-2:]), max(s[-2:])) for s in shapes] if entry.transposes_tall else shapes  # the loops' inputs
    assert muon_compile.counters["bucket.buckets"] == bucket_count(seen, device, entry.dtype) * graphs
    eager = run_entry(entry, shapes, device=device)
    exact = run_entry(entry, shapes, dtype=torch.float64, device=device)
    for i, (g, e, x, s) in enumerate(zip(got, eager, exact, start)):
        assert_rewrite_close(g - s, e - s, x - s, entry.dtype, f"{name} param {i} {shapes[i]}")


def what_the_backend_meets(entry, shapes):
    """One step of ``entry`` as Dynamo and the recogniser see it, as one line: graphs,
    loops matched, rejection reasons, graph-break reasons."""
    params = make_params(shapes)
    step = entry.make(params, entry.dtype)
    set_grads(params, 100)
    torch._dynamo.reset()
    with torch.no_grad():
        seen = torch._dynamo.explain(step)()
    matched, reasons = 0, []
    for gm in seen.graphs:
        m, r = plan_canonical(gm.graph)
        matched += len(m)
        reasons += [rejection.reason for rejection in r]
        reasons += [reason for _, reason in unseen_loops(gm.graph, [x.chain for x in m] + [x.chain for x in r])]
    breaks = [str(b.reason).splitlines()[0] for b in seen.break_reasons]
    return (f"{seen.graph_count} graph(s); {matched}/{entry.loops(shapes)} matched; rejected: {'; '.join(reasons)}; "
            f"breaks: {'; '.join(breaks)}")


@pytest.mark.parametrize("name", NOT_YET)
def test_an_entry_not_yet_recognised_fails_as_recorded(name):
    """What ``Entry.today`` records is what the backend meets today, and the step is not
    one graph of recognised loops (else the entry is recognised: clear ``today``)."""
    entry = corpus_entry(name)
    shapes = corpus_shapes(entry)
    met = what_the_backend_meets(entry, shapes)
    assert entry.today in met, met
    assert not met.startswith(f"1 graph(s); {entry.loops(shapes)}/{entry.loops(shapes)} matched; rejected: ;"), met


def test_deepmd_gram_routine_is_recognised_where_traced():
    """DeePMD-kit's step never reaches the backend whole (``what_the_backend_meets``), but its
    Gram routine, traced by itself as the backend would see it in an unsplit step, is one op:
    the damped Polar Express coefficients exactly, fp16, ``algorithm="gram"`` restarted where
    the code restarts (before iteration 2)."""
    from published.deepmd_hybrid_muon import PE_DAMPED, _DeepmdGramCall

    routine = _DeepmdGramCall()
    capture = GraphCapture()
    torch.compile(routine._run, backend=capture)(torch.randn(3, 8, 24))
    gm = capture.only
    (match,), rejected = plan_canonical(gm.graph)
    assert not rejected
    args = match.args
    assert args.coefficients == PE_DAMPED and (args.compute_dtype, args.algorithm, args.restarts) == (torch.float16, "gram", (2,))

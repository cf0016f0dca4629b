"""The canonicalize pass: unmodified Newton–Schulz code (torch.optim.Muon, hand-written
loops in the usual forms) becomes the op, bucketed like muon_compile.Muon; near misses
are left alone with their reason. Compiled results against eager execution of the same
code, every time."""

import inspect

import pytest
import torch

import muon_compile
from muon_compile.passes.canonicalize.apply import plan_canonical
from muon_compile.passes.canonicalize.near_miss import unseen_loops

from helpers import GraphCapture, bucket_count, compile_with_dump, count_ns_calls, dumped_graphs, make_params, set_grads
from ns_forms import FORMS, NEAR_MISSES, SINGLE_DEVICE_FORMS, UNSEEN, exact_torch_muon
from numerics import NS_RTOL, assert_rel_close, assert_rewrite_close

# wide, tall, square and odd matrices, and a tall / wide pair of one canonical shape
SHAPES_2D = [(24, 8), (8, 8), (8, 32), (5, 7), (32, 8)]
SHAPES_3D = [(3, 8, 12), (2, 12, 8)]


def _inputs(shapes, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(device) for s in shapes]


def _compile_form(fn, shapes, tmp_path, dtype=torch.float32, device="cpu", **kw):
    """``backend="muon"``, eager and exact (fp64) results of ``[fn(G) for G in inputs]``,
    and the dumped graphs."""
    from muon_compile import config

    def many(Gs, dtype=dtype):
        return [fn(G, dtype=dtype, **kw) for G in Gs]

    inputs = _inputs(shapes, device=device)
    with config.override(dump_dir=str(tmp_path)):
        got = torch.compile(many, backend="muon")(inputs)
    exact = many([G.double() for G in inputs], dtype=torch.float64)
    return got, many(inputs), exact, dumped_graphs(tmp_path)


def _dynamo_graph(fn, inputs):
    """The torch-level graph Dynamo hands a backend for ``fn(*inputs)``."""
    capture = GraphCapture()
    torch.compile(fn, backend=capture)(*inputs)
    return capture.only


def _own_dtype(form):
    return inspect.signature(SINGLE_DEVICE_FORMS[form]).parameters["dtype"].default


# Each form compiled in the dtype its source iterates in (bf16, fp32 for the cubic), and
# Keller's in fp32 as well: the dtype is read off the loop's one cast by one rule, and the
# fast test below plans every form in both dtypes.
COMPILED_FORMS = [(form, _own_dtype(form)) for form in SINGLE_DEVICE_FORMS] + [("keller", torch.float32)]


@pytest.mark.slow
@pytest.mark.parametrize(("form", "dtype"), COMPILED_FORMS, ids=[f"{f}-{str(d)[6:]}" for f, d in COMPILED_FORMS])
def test_form_becomes_one_op_per_matrix(device, form, dtype, tmp_path):
    shapes = SHAPES_2D + SHAPES_3D
    got, eager, exact, graphs = _compile_form(SINGLE_DEVICE_FORMS[form], shapes, tmp_path, dtype=dtype, device=device)
    assert muon_compile.counters["canonicalize.matched"] == len(shapes)
    assert muon_compile.counters["canonicalize.rejected"] == 0
    assert count_ns_calls(graphs["canonicalize_after"]) == len(shapes)
    assert "matmul" not in graphs["canonicalize_after"] and "addmm" not in graphs["canonicalize_after"]
    for i, (g, e, x) in enumerate(zip(got, eager, exact)):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert_rewrite_close(g, e, x, dtype, f"matrix {i} {shapes[i]}")


@pytest.mark.parametrize("form", SINGLE_DEVICE_FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_form_is_planned_as_one_match_per_matrix(form, dtype):
    """The recogniser's verdict alone (no compile), fast: one match per matrix, wide, tall
    and batched, with the dtype the loop iterates in."""
    shapes = [(8, 12), (12, 8), (2, 8, 12)]
    gm = _dynamo_graph(lambda Gs: [SINGLE_DEVICE_FORMS[form](G, dtype=dtype) for G in Gs], [_inputs(shapes)])
    matches, rejected = plan_canonical(gm.graph)
    assert len(matches) == len(shapes) and not rejected, [r.reason for r in rejected]
    assert all(m.args.compute_dtype == dtype for m in matches), [m.args for m in matches]


@pytest.mark.parametrize("steps", [pytest.param(1, marks=pytest.mark.slow), 3, pytest.param(8, marks=pytest.mark.slow)])
def test_any_number_of_steps(device, steps, tmp_path):
    got, eager, exact, graphs = _compile_form(FORMS["polar_express"], SHAPES_2D[:3], tmp_path, device=device, steps=steps)
    assert muon_compile.counters["canonicalize.matched"] == 3
    assert f", {steps}, 1e-07, 1.01, False, f32, 'auto')" in graphs["canonicalize_after"]
    for g, e, x in zip(got, eager, exact):
        assert_rewrite_close(g, e, x, torch.float32)


def test_coefficients_eps_and_dtype_are_read_off_exactly():
    from ns_forms import POLAR, POLAR_SAFETY, addmm_clamped, polar_express, two_divisions

    gm = _dynamo_graph(lambda G: polar_express(G, steps=4), _inputs([(8, 12)]))
    (match,), rejected = plan_canonical(gm.graph)
    assert not rejected
    args = match.args
    assert args.steps == 4
    assert [c for t in args.coefficients for c in t] == pytest.approx([c for t in POLAR[:4] for c in t], rel=1e-12)
    assert (args.norm_scale, args.eps, args.clamp_eps, args.compute_dtype) == (POLAR_SAFETY, 1e-7, False, torch.bfloat16)

    gm = _dynamo_graph(lambda G: addmm_clamped(G, steps=2), _inputs([(12, 8)]))
    (match,), _ = plan_canonical(gm.graph)
    assert [c for t in match.args.coefficients for c in t] == pytest.approx([3.4445, -4.775, 2.0315] * 2, rel=1e-12)
    assert (match.args.clamp_eps, match.args.eps) == (True, 1e-7)
    # tall: the final in-place scale is kept apart from the last step's coefficients
    assert [r.scale for r in match.replacements] == pytest.approx([1.5**0.5])

    # a second division of the normalised matrix scales the clamped norm and its eps alike
    gm = _dynamo_graph(lambda G: two_divisions(G, steps=2), _inputs([(8, 12)]))
    (match,), rejected = plan_canonical(gm.graph)
    assert not rejected
    assert (match.args.norm_scale, match.args.eps, match.args.clamp_eps) == pytest.approx((POLAR_SAFETY, 1e-7 * POLAR_SAFETY, True))



@pytest.mark.parametrize("shape", [(8, 12), (12, 8), (2, 8, 12)])
def test_a_loop_on_the_gram_matrix_is_read_off_exactly(shape):
    """``R <- Z R Z``, ``Q <- Q Z`` and a restart ``X <- Q X``: the op with ``algorithm="gram"``,
    each iteration's coefficients exactly as written (not re-derived from ``Z R Z``), the
    restart where the code put it."""
    from ns_forms import POLAR, gram_with_restart

    gm = _dynamo_graph(lambda G: gram_with_restart(G, steps=5), _inputs([shape]))
    (match,), rejected = plan_canonical(gm.graph)
    assert not rejected
    assert match.args.coefficients == tuple(POLAR[:5])
    assert (match.args.algorithm, match.args.compute_dtype, match.args.eps) == ("gram", torch.bfloat16, 1e-7)
    assert match.chain.restarts == match.args.restarts == (2,)
    assert [r.scale for r in match.replacements] == [1.0]


@pytest.mark.parametrize("table", [False, True], ids=["triple", "table"])
def test_tensor_settings_held_as_graph_inputs_are_planned_as_constants(table):
    """eps, norm scale and coefficients (a triple, or one row per iteration) read from tensor
    inputs fold to their values; the lr that only scales the result is no loop constant;
    without the inputs' values, no match."""
    from ns_forms import KELLER, TensorSettings

    settings = TensorSettings(table=table)
    capture = GraphCapture()
    torch.compile(lambda G: settings(G), backend=capture)(_inputs([(8, 12)])[0])
    gm, (example_inputs,) = capture.only, capture.inputs
    values = dict(zip(gm.graph.find_nodes(op="placeholder"), example_inputs))
    (match,), rejected = plan_canonical(gm.graph, values)
    assert not rejected
    f32 = [float(torch.tensor(v)) for v in (*KELLER, 1.01, 1e-7)]  # the tensors hold float32 values
    assert match.args.coefficients == (tuple(f32[:3]),) * 3
    assert (match.args.norm_scale, match.args.eps) == (f32[3], f32[4])
    assert sorted(n.name.rsplit("_", 1)[-1] for n, _ in match.chain.fixed) == ["abc", "eps", "scale"]
    assert [r.scale for r in match.replacements] == [1.0]  # lr is applied by its own node, at run time
    matches, rejected = plan_canonical(gm.graph)
    assert not matches


def test_arithmetic_on_tensor_constants_is_folded():
    """``1 - (one - 1e-7)`` and ``2 * c / 2`` on tensors made in the step read off as numbers."""
    from ns_forms import KELLER

    def ns(G):
        eps = 1 - (torch.tensor(1.0) - 1e-7)
        a, b, c = torch.tensor(KELLER)
        X = G / (G.norm() + eps)
        for _ in range(2):
            A = X @ X.T
            X = a * X + (b * A + (2 * c / 2) * A @ A) @ X
        return X

    (match,), rejected = plan_canonical(_dynamo_graph(ns, _inputs([(8, 12)])).graph)
    assert not rejected
    assert match.args.eps == float(1 - (torch.tensor(1.0) - 1e-7))
    assert match.args.coefficients == (tuple(float(v) for v in torch.tensor(KELLER)),) * 2


def test_tensor_settings_held_as_graph_inputs_compile_to_the_op(device, tmp_path):
    """Compiled == eager, also after lr changes; changing a compiled-in constant fails loudly."""
    from muon_compile import config
    from ns_forms import TensorSettings

    settings = TensorSettings(device)
    shapes = [(8, 12), (12, 8), (2, 8, 12)]

    def many(Gs, dtype=torch.bfloat16):
        return [settings(G, dtype=dtype) for G in Gs]

    inputs = _inputs(shapes, device=device)
    with config.override(dump_dir=str(tmp_path)):
        compiled = torch.compile(many, backend="muon")
        got = compiled(inputs)
    assert muon_compile.counters["canonicalize.matched"] == len(shapes)
    assert count_ns_calls(dumped_graphs(tmp_path)["canonicalize_after"]) == len(shapes)
    for _ in range(2):
        exact = many([G.double() for G in inputs], dtype=torch.float64)
        for g, e, x in zip(got, many(inputs), exact):
            assert_rewrite_close(g, e, x, torch.bfloat16)
        settings.lr.mul_(0.5)
        got = compiled(inputs)
    if device == "cpu":  # on CUDA the check is a device-side assert, which ends the process
        settings.eps.fill_(1e-6)
        with pytest.raises(RuntimeError, match="has changed since"):
            compiled(inputs)


@pytest.mark.parametrize("fn", NEAR_MISSES, ids=lambda f: f.__name__)
def test_near_miss_is_rejected_with_its_reason(fn):
    shapes, reason = NEAR_MISSES[fn]
    gm = _dynamo_graph(fn, _inputs(shapes))
    before = gm.code
    matches, rejected = plan_canonical(gm.graph)
    assert not matches and len(rejected) == 1
    assert reason in rejected[0].reason, rejected[0].reason
    assert gm.code == before  # planning does not touch the graph


@pytest.mark.parametrize("fn", UNSEEN, ids=lambda f: f.__name__)
def test_a_loop_the_walk_never_starts_is_found_with_its_reason(fn):
    """No candidate, so no rejection: the near-miss search still finds the loop, once."""
    shapes, reason = UNSEEN[fn]
    gm = _dynamo_graph(fn, _inputs(shapes))
    matches, rejected = plan_canonical(gm.graph)
    assert not matches and not rejected
    unseen = unseen_loops(gm.graph, [])
    assert len(unseen) == 1 and reason in unseen[0][1], unseen


@pytest.mark.parametrize("fn", list(FORMS.values()) + list(NEAR_MISSES), ids=lambda f: f.__name__)
def test_no_loop_of_a_candidate_is_reported_unseen(fn):
    """The loops the walk does see (recognised or rejected) are not reported again."""
    shapes = NEAR_MISSES[fn][0] if fn in NEAR_MISSES else [(8, 12)]
    gm = _dynamo_graph(fn, _inputs(shapes))
    matches, rejected = plan_canonical(gm.graph)
    assert unseen_loops(gm.graph, [m.chain for m in matches] + [r.chain for r in rejected]) == []


@pytest.mark.slow
@pytest.mark.parametrize("fn", NEAR_MISSES, ids=lambda f: f.__name__)
def test_near_miss_compiles_unchanged(device, fn, tmp_path):
    shapes, _ = NEAR_MISSES[fn]
    got, eager, _, graphs = _compile_form(fn, shapes, tmp_path, device=device)
    assert muon_compile.counters["canonicalize.matched"] == 0
    assert muon_compile.counters["canonicalize.rejected"] == 1
    assert muon_compile.counters["find.ns_ops"] == 0 and "canonicalize_after" not in graphs
    for g, e in zip(got, eager):
        assert_rel_close(g, e, NS_RTOL[device][torch.float32], fn.__name__)


def torch_muon(**kw):
    return lambda params: torch.optim.Muon(params, **kw)


def run_torch_muon(shapes, steps, compiled, device, **opt_kw):
    """Weights after ``steps`` steps of torch.optim.Muon (eager, or ``backend="muon"``)."""
    params = make_params(shapes, device=device)
    opt = torch.optim.Muon(params, **opt_kw)
    step = torch.compile(opt.step, backend="muon") if compiled else opt.step
    for s in range(steps):
        set_grads(params, 100 + s)
        step()
    return [p.detach() for p in params]


def check_torch_muon(shapes, device, steps=3, **opt_kw):
    """Compiled torch.optim.Muon against eager and against eager with its NS in fp64."""
    start = [p.detach() for p in make_params(shapes, device=device)]
    got = run_torch_muon(shapes, steps, True, device, **opt_kw)
    eager = run_torch_muon(shapes, steps, False, device, **opt_kw)
    with exact_torch_muon():
        exact = run_torch_muon(shapes, steps, False, device, **opt_kw)
    for i, (g, e, x, s) in enumerate(zip(got, eager, exact, start)):
        assert_rewrite_close(g - s, e - s, x - s, torch.bfloat16, f"param {i} {shapes[i]}")


@pytest.mark.slow
@pytest.mark.parametrize("nesterov", [True, False], ids=["nesterov", "plain"])
def test_torch_optim_muon_is_bucketed_like_muon_compile(device, nesterov):
    shapes = SHAPES_2D * 2  # 10 matrices: 8x24, 8x8, 8x32 (with the tall 32x8 where it joins as its transpose), 5x7
    check_torch_muon(shapes, device, lr=0.05, weight_decay=0.1, nesterov=nesterov)
    assert muon_compile.counters["canonicalize.matched"] == len(shapes)
    assert muon_compile.counters["find.ns_ops"] == len(shapes)
    assert muon_compile.counters["bucket.buckets"] == bucket_count(shapes, device)


@pytest.mark.slow
def test_canonicalize_can_be_switched_off(device, tmp_path):
    graphs, step = compile_with_dump(torch_muon(), SHAPES_2D, tmp_path, device=device, passes="-canonicalize")
    assert muon_compile.counters["canonicalize.matched"] == 0 and not graphs
    step.assert_close(NS_RTOL[device][torch.bfloat16])  # the user's own loop, compiled as written


@pytest.mark.slow
def test_loop_on_a_tensor_that_requires_grad_is_left_to_autograd(device):
    """The op has no derivative: a Newton–Schulz loop inside a model's forward stays as it
    was, and its gradient is eager's."""
    from ns_forms import keller

    W = torch.randn(8, 12, generator=torch.Generator().manual_seed(0)).to(device).requires_grad_()
    W2 = W.detach().clone().requires_grad_()
    torch.compile(lambda w: keller(w, steps=2, dtype=torch.float32).square().sum(), backend="muon")(W).backward()
    keller(W2, steps=2, dtype=torch.float32).square().sum().backward()
    assert muon_compile.counters["canonicalize.matched"] == 0
    assert muon_compile.counters["canonicalize.rejected"] == 1
    assert_rel_close(W.grad, W2.grad, NS_RTOL[device][torch.float32], "grad")

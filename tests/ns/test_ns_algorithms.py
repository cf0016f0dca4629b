"""The Newton–Schulz algorithm per bucket (issue 14): what each evaluation computes and
costs (muon_compile.ns.cost), the choice of ``auto`` and its policy variable, the plan the
passes make of it, and compiled == eager with each algorithm."""

import dataclasses
import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code
from torch.utils.flop_counter import FlopCounterMode

import muon_compile
from muon_compile import config
from muon_compile.diagnostics import explain
from muon_compile.ns import matmul_rates, cost as ns_cost
from muon_compile.ns.coefficients import ns_args
from muon_compile.diagnostics.counters import counters
from muon_compile.ns.evaluate import orthogonalize
from muon_compile.ns.op import newton_schulz_op

from helpers import MIXED_SHAPES, compare_steps, make_params, set_grads
from numerics import NS_RTOL, assert_rel_close, assert_rewrite_close, rel_err

@pytest.mark.parametrize("shape", [(16, 48), (48, 16), (24, 24), (3, 16, 40)])
@pytest.mark.parametrize("algorithm", ["textbook", "gram"])
@pytest.mark.parametrize("steps", [1, 2, 5])
def test_flop_formulas_count_the_kernels_matmuls(shape, algorithm, steps):
    """ns_flops (used by the plans and the benchmarks) is what the kernel runs, counted by torch."""
    x = torch.randn(shape)
    args = dataclasses.replace(ns_args("keller", steps), algorithm=algorithm)
    with FlopCounterMode(display=False) as counter:
        orthogonalize(x, args)
    batch = shape[0] if len(shape) == 3 else 1
    assert counter.get_total_flops() == batch * ns_cost.ns_flops(shape[-2], shape[-1], steps, algorithm)


def test_gram_flops_closed_form():
    """``4 k m^2 n + (8 T - 6 k) m^3`` for ``k`` runs between restarts (a restart every 3 iterations)."""
    m, n = 384, 1536
    assert ns_cost.ns_flops(m, n, 5, "textbook") == 5 * (4 * m * m * n + 2 * m**3)
    assert ns_cost.segments(5) == (3, 2) and ns_cost.segments(2) == (2,) and ns_cost.segments(7) == (3, 3, 1)
    assert ns_cost.ns_flops(m, n, 5, "gram") == 4 * 2 * m * m * n + (8 * 5 - 6 * 2) * m**3
    assert ns_cost.ns_flops(m, n, 2, "gram") == 4 * m * m * n + (8 * 2 - 6) * m**3
    assert ns_cost.ns_flops(n, m, 5, "gram") == ns_cost.ns_flops(m, n, 5, "gram")  # tall = its transpose


@pytest.mark.parametrize("restarts", [None, (), (2,), (1, 3, 4)], ids=["default", "none", "2", "1-3-4"])
def test_gram_restarts_where_asked(restarts):
    """``NSArgs.restarts`` (kept from a hand-written Gram loop) splits the Gram iteration
    there; in fp64 every split computes the textbook polynomial (to 1e-12, the products'
    rounding over 5 steps on a unit-norm input)."""
    bounds = (0, *restarts, 5) if restarts is not None else None
    expected = ns_cost.segments(5) if bounds is None else tuple(b - a for a, b in zip(bounds, bounds[1:]))
    assert ns_cost.segments(5, restarts) == expected
    x = torch.randn(3, 16, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    args = dataclasses.replace(ns_args("polar_express", 5, compute_dtype=torch.float64), algorithm="gram", restarts=restarts)
    textbook = orthogonalize(x, dataclasses.replace(args, algorithm="textbook", restarts=None))
    with FlopCounterMode(display=False) as counter:
        got = orthogonalize(x, args)
    torch.testing.assert_close(got, textbook, rtol=0, atol=1e-12)
    runs, m, n = len(expected), 16, 40  # the kernel restarts where asked: 4 k m^2 n + (8 T - 6 k) m^3
    assert counter.get_total_flops() == 3 * (4 * runs * m * m * n + (8 * 5 - 6 * runs) * m**3)


def test_pointwise_bytes_by_hand():
    """The memory-bound passes beside the products, bf16 in and out: textbook reads the
    matrix twice and writes it once (norm, scale), and per iteration reads two ``m x m``
    matrices and writes one; Gram adds an fp32 copy, its fp16 cast and the result's
    rescale, and iterates in fp16 (the same 2 bytes)."""
    m, n = 384, 1536
    assert ns_cost.pointwise_bytes("textbook", m, n, 5, torch.bfloat16) == 3 * m * n * 2 + 5 * 3 * m * m * 2
    assert ns_cost.pointwise_bytes("textbook", n, m, 5, torch.bfloat16) == ns_cost.pointwise_bytes("textbook", m, n, 5, torch.bfloat16)
    assert ns_cost.pointwise_bytes("textbook", m, n, 5, torch.float32) == 3 * m * n * 4 + 5 * 3 * m * m * 4
    gram = m * n * (2 + 2 + 4 + 4 + 2 + 2 + 2) + 5 * 3 * m * m * 2
    assert ns_cost.pointwise_bytes("gram", m, n, 5, torch.bfloat16) == gram
    with pytest.raises(ValueError, match="concrete algorithm"):
        ns_cost.pointwise_bytes("auto", m, n, 5, torch.bfloat16)


@pytest.fixture
def flat_rates(monkeypatch):
    """Every dtype and size at one rate: the choice then follows the FLOPs alone."""
    table = ((1, 100.0),)
    flat = matmul_rates.MatmulRates("cpu", "test", {d: table for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64)})
    monkeypatch.setitem(matmul_rates.PROFILES, "cpu", flat)


def test_auto_takes_the_cheaper_algorithm(flat_rates):
    assert ns_cost.choose(384, 1536, 5, torch.bfloat16, "cpu").algorithm == "gram"  # 0.67x the FLOPs
    assert ns_cost.choose(1536, 384, 5, torch.bfloat16, "cpu").algorithm == "gram"
    square = ns_cost.choose(384, 384, 5, torch.bfloat16, "cpu")
    assert square.algorithm == "textbook" and square.flops["gram"] > square.flops["textbook"]
    assert "predicted Gram/textbook time 1.20 on cpu" in square.reason


def test_an_empty_matrix_costs_nothing_and_is_planned():
    """A rank's block may be empty (a tensor-parallel block of a one-row matrix): its products
    cost no time, and the choice is made without dividing by its size."""
    assert matmul_rates.profile_for("cpu").seconds(torch.bfloat16, 0, 10, 10, 5) == 0.0
    choice = ns_cost.choose(0, 10, 5, torch.bfloat16, "cpu")
    assert choice.flops == {"textbook": 0, "gram": 0} and set(choice.seconds.values()) == {0.0}


def test_auto_prices_each_algorithm_in_its_own_dtype():
    """A bf16 Gram iteration runs in fp16: on this project's CPU table fp16 products are
    ~100x slower than bf16 ones (no fp16 matmul path), so auto keeps the textbook iteration there
    even where Gram needs fewer FLOPs; on the CUDA table they share a rate and Gram wins."""
    cpu = ns_cost.choose(384, 1536, 5, torch.bfloat16, "cpu")
    assert cpu.algorithm == "textbook"
    assert cpu.flops["gram"] < cpu.flops["textbook"] and cpu.seconds["gram"] > cpu.seconds["textbook"]
    assert ns_cost.choose(2048, 8192, 5, torch.bfloat16, "cuda").algorithm == "gram"
    assert ns_cost.iteration_dtype("gram", torch.bfloat16) == torch.float16


def test_auto_never_picks_gram_where_it_is_not_accurate(flat_rates):
    for dtype in (torch.float32, torch.float64):
        choice = ns_cost.choose(384, 1536, 5, dtype, "cpu")
        assert choice.algorithm == "textbook" and f"Gram is not accurate enough in {dtype}" == choice.reason
    long = ns_cost.choose(384, 1536, 6, torch.bfloat16, "cpu")
    assert long.algorithm == "textbook" and "up to 5 steps" in long.reason


def test_requested_algorithm_beats_policy_beats_cost(flat_rates):
    assert ns_cost.choose(384, 384, 5, torch.bfloat16, "cpu", policy="gram").algorithm == "gram"
    assert ns_cost.choose(384, 1536, 5, torch.bfloat16, "cpu", policy="textbook").algorithm == "textbook"
    forced = ns_cost.choose(384, 1536, 5, torch.bfloat16, "cpu", requested="textbook", policy="gram")
    assert (forced.algorithm, forced.reason) == ("textbook", "requested by the call")


def test_policy_variable_is_parsed_validated_and_keyed():
    assert config.from_env({}).ns_algorithm == "auto"
    assert config.from_env({"MUON_COMPILE_NS_ALGORITHM": " gram "}).ns_algorithm == "gram"
    with pytest.raises(ValueError, match=r"MUON_COMPILE_NS_ALGORITHM must be one of \['auto', 'textbook', 'gram'\], got 'fast'"):
        config.from_env({"MUON_COMPILE_NS_ALGORITHM": "fast"})
    assert config.Config(ns_algorithm="gram").cache_key() != config.Config().cache_key()


def test_bad_algorithm_names_the_setting():
    with pytest.raises(ValueError, match="newton_schulz algorithm must be one of"):
        muon_compile.newton_schulz(torch.randn(4, 8), algorithm="fast")
    with pytest.raises(ValueError, match="ns_algorithm must be one of"):
        muon_compile.Muon([{"params": [torch.nn.Parameter(torch.randn(4, 8))], "kind": "muon"}], ns_algorithm="fast")


def test_eager_auto_follows_the_policy(flat_rates):
    """The op's eager ``auto`` resolves by the same rule as the passes: policy, then cost."""
    x = torch.randn(16, 48)
    gram = muon_compile.newton_schulz(x, algorithm="gram")
    text = muon_compile.newton_schulz(x, algorithm="textbook")
    assert not torch.equal(gram, text)
    assert torch.equal(muon_compile.newton_schulz(x), gram)  # 16x48: Gram needs fewer FLOPs
    with config.override(ns_algorithm="textbook"):
        assert torch.equal(muon_compile.newton_schulz(x), text)


def _muon(algorithm):
    return lambda params: muon_compile.Muon(
        [{"params": params, "kind": "muon"}], lr=0.05, ns_dtype=torch.bfloat16, ns_algorithm=algorithm
    )


@pytest.mark.parametrize("algorithm", ["textbook", "gram"])
def test_compiled_step_equals_eager_with_each_algorithm(algorithm):
    counters.clear()
    compare_steps(_muon(algorithm), MIXED_SHAPES, rtol=NS_RTOL["cpu"][torch.bfloat16], dtype=torch.bfloat16)
    # each bucket by it; the textbook iteration keeps a tall matrix's layout on this CPU
    # (ns.cost.choose_orientation), so MIXED_SHAPES' tall 24x8 and 32x8 bucket apart from the wide 8x32
    buckets = {"textbook": 6, "gram": 5}[algorithm]
    assert counters[f"lower.{algorithm}"] == counters["bucket.buckets"] == buckets, dict(counters)
    assert counters["lower.gram" if algorithm == "textbook" else "lower.textbook"] == 0


@pytest.mark.parametrize("preset, steps", [("keller", 5), ("polar_express", 5), ("polar_express", 10), ("aol", 10)])
def test_gram_iteration_of_an_input_near_zero_or_huge_stays_in_range(preset, steps):
    """An input whose norm is below the normalisation's eps (a momentum decayed towards
    zero: an expert no token reached for many steps): the Gram iteration (fp16) took its
    R R, then X, out of fp16's range (NaN); now it is finite and, as where ``auto`` picks it
    (docs/benchmarks.md), no less accurate than the bf16 textbook iteration against the
    exact one; also where the squares of its entries underflow fp32 (1e-30, 1e-38: the
    norm was 0, Gram's result NaN) or overflow it (1e30: the norm was inf, the textbook's
    result 0 and Gram's NaN). A zero input gives zero."""
    g = torch.Generator().manual_seed(0)
    for scale in (1e-12, 1e-30, 1e-38, 1e30):
        x = torch.randn(64, 256, generator=g) * scale
        exact = muon_compile.newton_schulz(x.double(), preset, steps, compute_dtype=torch.float64, algorithm="textbook")
        gram, textbook = (
            muon_compile.newton_schulz(x, preset, steps, compute_dtype=torch.bfloat16, algorithm=a) for a in ("gram", "textbook")
        )
        assert gram.isfinite().all(), scale
        assert rel_err(gram, exact) <= rel_err(textbook, exact), (scale, rel_err(gram, exact), rel_err(textbook, exact))
    zero = muon_compile.newton_schulz(torch.zeros(64, 256), preset, steps, algorithm="gram")
    assert torch.equal(zero, torch.zeros(64, 256))


def test_compiled_gram_step_of_gradients_near_zero_or_huge_equals_eager():
    """The same through a compiled step, four matrices of one bucket scaled apart: the
    scales are per matrix, in the generated code too."""
    shapes = [(8, 24), (8, 24), (24, 8), (8, 24)]
    params = make_params(shapes)
    compiled = torch.compile(_muon("gram")(params).step, backend="muon")
    twins = make_params(shapes)
    eager = _muon("gram")(twins)
    for p, q, scale in zip(params, twins, [1e-12, 1e-30, 0.0, 1e30]):
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * scale
        q.grad = p.grad.clone()
    before = [q.detach().clone() for q in twins]
    compiled()
    eager.step()
    for p, q, b in zip(params, twins, before):
        assert p.isfinite().all()
        assert_rel_close(p.detach() - b, q.detach() - b, NS_RTOL["cpu"][torch.bfloat16], tuple(p.shape))


def test_unmodified_torch_optim_muon_follows_the_policy():
    """A loop recognised in unmodified code becomes an op with ``auto``: the policy reaches
    it; the Gram result is as accurate as eager's own bf16 textbook loop (the rewrite rule)."""
    from ns_forms import exact_torch_muon
    from numerics import assert_rewrite_close

    shapes = [(16, 48), (48, 16)]
    params, eager_params, exact = (make_params(shapes) for _ in range(3))
    for ps in (params, eager_params, exact):
        set_grads(ps, 0)
    start = [p.detach().clone() for p in params]
    counters.clear()
    with config.override(ns_algorithm="gram"):
        torch.compile(torch.optim.Muon(params, lr=0.02).step, backend="muon")()
    assert counters["lower.gram"] == 1 and counters["lower.textbook"] == 0
    torch.optim.Muon(eager_params, lr=0.02).step()
    with exact_torch_muon():
        torch.optim.Muon(exact, lr=0.02).step()
    for c, e, x, s in zip(params, eager_params, exact, start):
        assert_rewrite_close(c.detach() - s, e.detach() - s, x.detach() - s, torch.bfloat16)


def test_policy_reaches_the_compiled_plan_and_the_explanation(flat_rates):
    """With ``auto``, the wide and tall buckets run Gram and the square ones the textbook
    iteration; the plan names each choice, its reason and the FLOPs per step, and for the
    textbook iteration where its scalars go."""
    w, g = torch.randn(16, 48), torch.randn(16, 48)
    s, h = torch.randn(16, 16), torch.randn(16, 16)

    def step(w, g, s, h):
        w.sub_(0.1 * muon_compile.newton_schulz(g))
        s.sub_(0.1 * muon_compile.newton_schulz(h))

    (report,) = explain.explain(step, w, g, s, h)
    text = str(report)
    assert "1 x 16x48 torch.bfloat16: gram (predicted Gram/textbook time" in text, text
    assert "1 x 16x16 torch.bfloat16: textbook (predicted Gram/textbook time 1.20" in text, text
    assert "NS GFLOP per step: chosen" in text
    # the textbook bucket names where its scalars go, and why (issue 75; flat_rates' profile has no table)
    assert "; scalars in the epilogue (no measured epilogue table on cpu for torch.bfloat16)" in text, text
    with config.override(ns_algorithm="textbook", ns_epilogue="off"):
        (report,) = explain.explain(step, w, g, s, h)
    assert "16x48 torch.bfloat16: textbook (MUON_COMPILE_NS_ALGORITHM=textbook;" in str(report)
    assert "; scalars in the polynomial (MUON_COMPILE_NS_EPILOGUE=off)" in str(report), str(report)


def test_symmetric_products_only_where_measured_faster_or_asked(monkeypatch):
    """``MUON_COMPILE_SYM_PRODUCTS`` (issue 62): ``auto`` takes the symmetric kernel only where
    the device's table measured it faster at the Gram matrix's size (no device has a table
    yet, the CPU never will), ``on`` wherever the products' dtype is bf16 / fp16, ``off``
    never; a bad value is refused by name."""
    import dataclasses as dc

    from muon_compile.ns import matmul_rates

    choose = ns_cost.choose_products
    for device in ("cpu", "cuda"):
        assert choose(64, 256, "textbook", torch.bfloat16, device) == ns_cost.ProductChoice("bmm", f"no measured rate of symmetric products on {device}")
    assert choose(64, 256, "gram", torch.bfloat16, "cpu", "on").kind == "sym"  # the Gram products are fp16
    assert choose(64, 256, "textbook", torch.float32, "cuda", "on").kind == "bmm"
    assert choose(64, 256, "textbook", torch.bfloat16, "cuda", "off").kind == "bmm"
    measured = dc.replace(matmul_rates.PROFILES["cuda"], symmetric={torch.bfloat16: ((256, 0.8), (1024, 1.3))})
    monkeypatch.setitem(matmul_rates.PROFILES, "cuda", measured)
    assert choose(1024, 4096, "textbook", torch.bfloat16, "cuda").kind == "sym"
    assert choose(256, 1024, "textbook", torch.bfloat16, "cuda") == ns_cost.ProductChoice("bmm", "measured bmm/symmetric time 0.80 at 256")
    with pytest.raises(ValueError, match="MUON_COMPILE_SYM_PRODUCTS must be one of"):
        choose(64, 256, "textbook", torch.bfloat16, "cuda", "always")
    with pytest.raises(ValueError, match="MUON_COMPILE_SYM_PRODUCTS must be one of"):
        config.from_env({"MUON_COMPILE_SYM_PRODUCTS": "yes"})
    assert config.from_env({"MUON_COMPILE_SYM_PRODUCTS": "on"}).cache_key() != config.from_env({}).cache_key()


def _plan_choice(rows, cols, device, dtype=torch.bfloat16, **policies):
    """The plan ``plan_algorithms`` makes for a textbook NS node of 8 ``rows x cols`` matrices on ``device``."""
    from muon_compile.passes.find import NSSite
    from muon_compile.passes.lower.plan import plan_algorithms

    args = ns_args("keller", 5, compute_dtype=dtype, algorithm="textbook")
    site = NSSite(0, 8, rows, cols, 3, torch.float32, device, args)
    node = torch.fx.Graph().placeholder("ns")  # the plan reads a node's name only
    plan = plan_algorithms([node], [site], policy="auto", **policies)
    (choice,) = plan.choices
    assert choice.choice.algorithm == "textbook"
    return choice, plan


def _plan_form(rows, cols, device, dtype=torch.bfloat16):
    """The form ``plan_algorithms`` gives a textbook NS node of 8 ``rows x cols`` matrices on ``device``."""
    return _plan_choice(rows, cols, device, dtype)[0].epilogue


def test_the_plan_takes_the_form_each_devices_table_has_faster(monkeypatch):
    """``MUON_COMPILE_NS_EPILOGUE=auto`` (issue 75): the plan puts the textbook scalars where
    the device's measured table (``MatmulRates.epilogue``) has them faster: on this CPU, at
    every size and dtype measured, the form of the table's ratio there, so a change of
    lowering cannot cost the CPU again unmeasured; on CUDA, which has no table, the products'
    epilogue (the form it ran before the table), and the polynomial where a table says so;
    ``on`` / ``off`` force the form, a bad value is refused by name, and the setting is in
    the cache key."""
    cpu = matmul_rates.PROFILES["cpu"]
    for dtype, table in cpu.epilogue.items():
        for m, ratio in table:
            want = ns_cost.EPILOGUE if ratio > 1 else ns_cost.POLYNOMIAL
            for rows, cols in ((m, 4 * m), (4 * m, m)):
                form = _plan_form(rows, cols, "cpu", dtype)
                assert (form.kind, form.reason) == (want, f"measured polynomial/epilogue time {ratio:.2f} at {m}"), (m, dtype)
    assert _plan_form(384, 1536, "cpu").kind == ns_cost.POLYNOMIAL  # gpt-small's MLP matrices
    assert _plan_form(384, 1536, "cuda") == ns_cost.ProductChoice("epilogue", "no measured epilogue table on cuda for torch.bfloat16")
    measured = dataclasses.replace(matmul_rates.PROFILES["cuda"], epilogue={torch.bfloat16: ((256, 1.2), (1024, 0.9))})
    monkeypatch.setitem(matmul_rates.PROFILES, "cuda", measured)
    assert _plan_form(256, 1024, "cuda").kind == ns_cost.EPILOGUE
    assert _plan_form(1024, 4096, "cuda") == ns_cost.ProductChoice("polynomial", "measured polynomial/epilogue time 0.90 at 1024")
    for policy, kind in (("on", ns_cost.EPILOGUE), ("off", ns_cost.POLYNOMIAL)):
        assert ns_cost.choose_epilogue(384, 1536, torch.bfloat16, "cpu", policy).kind == kind
    with pytest.raises(ValueError, match="MUON_COMPILE_NS_EPILOGUE must be one of"):
        config.from_env({"MUON_COMPILE_NS_EPILOGUE": "yes"})
    assert config.from_env({"MUON_COMPILE_NS_EPILOGUE": "on"}).cache_key() != config.from_env({}).cache_key()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_textbook_forms_are_the_iteration(dtype, device):
    """The epilogue and the polynomial form of the textbook iteration (ns.evaluate.orthogonalize)
    are the same iteration, rounded differently: wide and tall, each is as accurate against
    the fp64 iteration as the other is (the rewrite rule of tests/support/numerics.py), and in fp32
    within fp32's NS bound of it; ``auto`` is the device's form."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 24, 64, generator=g, dtype=torch.float64).to(device)
    args = ns_args("keller", 5, compute_dtype=dtype, algorithm="textbook")
    for x in (x, x.mT):
        exact = orthogonalize(x, dataclasses.replace(args, compute_dtype=torch.float64))
        forms = {form: orthogonalize(x, args, epilogue=form) for form in (ns_cost.EPILOGUE, ns_cost.POLYNOMIAL)}
        assert_rewrite_close(forms[ns_cost.POLYNOMIAL], forms[ns_cost.EPILOGUE], exact, dtype, "polynomial against epilogue")
        assert_rewrite_close(forms[ns_cost.EPILOGUE], forms[ns_cost.POLYNOMIAL], exact, dtype, "epilogue against polynomial")
        if dtype == torch.float32:
            for form, y in forms.items():
                assert_rel_close(y, exact, NS_RTOL[device][dtype], form)
    chosen = ns_cost.choose_epilogue(24, 64, dtype, torch.device(device).type).kind
    assert torch.equal(orthogonalize(x, args), orthogonalize(x, args, epilogue=chosen))


def test_the_plan_takes_the_tall_layout_each_devices_table_has_faster(monkeypatch):
    """``MUON_COMPILE_NS_ORIENTATION=auto`` (issue 75): a tall matrix's textbook iterates keep its
    layout where the device's measured table (``MatmulRates.orientation``) has that faster: on this
    CPU at every size and dtype measured, the layout of the table's ratio there (the plan, its
    report and the bucket plan alike); on CUDA, which has no table, transposed (the layout it ran
    before the table), and native where a table says so; ``on`` / ``off`` force it, a wide matrix
    has one layout, a bad value is refused by name, and the setting is in the cache key."""
    from muon_compile.passes.bucket.plan import plan_buckets
    from muon_compile.passes.find import NSSite

    for dtype, table in matmul_rates.PROFILES["cpu"].orientation.items():
        for m, ratio in table:
            want = ns_cost.NATIVE if ratio > 1 else ns_cost.TRANSPOSED
            choice, plan = _plan_choice(4 * m, m, "cpu", dtype)
            assert choice.orientation == ns_cost.ProductChoice(want, f"measured transposed/native time {ratio:.2f} at {m}"), (m, dtype)
            assert f"; {want} layout (measured transposed/native time {ratio:.2f} at {m})" in plan.describe()
            site = NSSite(0, 1, 4 * m, m, 2, torch.float32, "cpu", ns_args("keller", 5, compute_dtype=dtype))
            (bucket,) = plan_buckets([site], bucket_mb=64, pad_waste=0).buckets
            assert bucket.members[0].transpose == (want == ns_cost.TRANSPOSED), (m, dtype)
    assert _plan_choice(1536, 384, "cpu")[0].orientation.kind == ns_cost.NATIVE  # gpt-small's MLP matrices
    assert _plan_choice(384, 1536, "cpu")[0].orientation == ns_cost.ProductChoice(ns_cost.TRANSPOSED, "a wide matrix")
    assert "layout" not in _plan_choice(384, 1536, "cpu")[1].describe()
    no_table = ns_cost.ProductChoice(ns_cost.TRANSPOSED, "no measured orientation table on cuda for torch.bfloat16")
    assert _plan_choice(1536, 384, "cuda")[0].orientation == no_table
    measured = dataclasses.replace(matmul_rates.PROFILES["cuda"], orientation={torch.bfloat16: ((256, 1.2), (1024, 0.9))})
    monkeypatch.setitem(matmul_rates.PROFILES, "cuda", measured)
    assert _plan_choice(1024, 256, "cuda")[0].orientation.kind == ns_cost.NATIVE
    assert _plan_choice(4096, 1024, "cuda")[0].orientation == ns_cost.ProductChoice("transposed", "measured transposed/native time 0.90 at 1024")
    for policy, kind in (("on", ns_cost.NATIVE), ("off", ns_cost.TRANSPOSED)):
        assert _plan_choice(1536, 384, "cpu", orientation=policy)[0].orientation.kind == kind
    with pytest.raises(ValueError, match="MUON_COMPILE_NS_ORIENTATION must be one of"):
        config.from_env({"MUON_COMPILE_NS_ORIENTATION": "tall"})
    assert config.from_env({"MUON_COMPILE_NS_ORIENTATION": "off"}).cache_key() != config.from_env({}).cache_key()


def test_the_plan_forms_products_in_fp32_where_the_devices_rates_have_them_faster(monkeypatch):
    """Products in fp32 (issue 75): where a CPU profile's measured rates have fp32 products faster
    than the iteration dtype's at the Gram matrix's size, the plan forms them in fp32
    (``ns.cost.WIDE``): at every size of each CPU profile, fp16 on both, bf16 on the one without
    AVX-512 (1-3 GFLOP/s against fp32's 150-175) and not on the reference one; never on CUDA;
    ``MUON_COMPILE_SYM_PRODUCTS=on`` still asks for the symmetric kernel; the report names the
    choice; ``MUON_COMPILE_CPU_RATES`` picks the profile (``auto``: by the CPU's AVX-512), refuses
    a bad name, and the profile itself is in the cache key."""
    from muon_compile.ns.matmul_rates import interpolate

    for name in matmul_rates.CPU_PROFILES:
        rates = matmul_rates.PROFILES[name]
        with config.override(cpu_rates=name):
            for dtype in matmul_rates.WIDENED:
                for m, _ in rates.tables[dtype]:
                    wide = interpolate(rates.tables[torch.float32], m, log_log=True) > interpolate(rates.tables[dtype], m, log_log=True)
                    choice, plan = _plan_choice(m, 4 * m, "cpu", dtype)
                    assert (choice.products.kind == ns_cost.WIDE) == wide, (name, dtype, m)
                    assert ("products in fp32" in plan.describe()) == wide
            assert ns_cost.choose_products(64, 256, "gram", torch.bfloat16, "cpu").kind == ns_cost.WIDE  # fp16 products
            assert ns_cost.choose_products(64, 256, "gram", torch.bfloat16, "cpu", "on").kind == ns_cost.SYMMETRIC
            assert ns_cost.choose_products(64, 256, "textbook", torch.float32, "cpu").kind == ns_cost.BMM
    with config.override(cpu_rates="cpu"):
        assert _plan_choice(384, 1536, "cpu")[0].products.kind == ns_cost.BMM  # gpt-small, AVX-512 BF16
    with config.override(cpu_rates="cpu-avx2"):
        assert _plan_choice(384, 1536, "cpu")[0].products == ns_cost.ProductChoice(
            ns_cost.WIDE, "measured fp32 products 173 GFLOP/s against 1.34 in torch.bfloat16 at 384"
        )
        assert _plan_choice(384, 1536, "cuda")[0].products.kind == ns_cost.BMM
    for avx512, name in ((True, "cpu"), (False, "cpu-avx2")):
        monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda avx512=avx512: avx512)
        assert matmul_rates.cpu_profile("auto") == name
        assert config.Config().plan_settings()[-2] == ("MUON_COMPILE_CPU_RATES", name)
    with pytest.raises(ValueError, match="MUON_COMPILE_CPU_RATES must be auto or one of cpu, cpu-avx2, got 'avx'"):
        config.from_env({"MUON_COMPILE_CPU_RATES": "avx"})
    avx2 = config.from_env({"MUON_COMPILE_CPU_RATES": "cpu-avx2"})
    assert avx2.cache_key() != config.from_env({"MUON_COMPILE_CPU_RATES": "cpu"}).cache_key()
    assert avx2.cache_key() == config.from_env({"MUON_COMPILE_CPU_RATES": "auto"}).cache_key()  # this CPU: no AVX-512 above


@pytest.mark.parametrize("algorithm", ["textbook", "gram"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_products_in_fp32_are_the_iteration(algorithm, dtype):
    """Products formed in fp32 on the iteration dtype's values and rounded back (``ns.cost.WIDE``)
    are the low-precision products up to the order of their sums: wide and tall, in both textbook
    forms and in Gram, as accurate against the fp64 iteration as with ``bmm`` (the rewrite rule of
    tests/support/numerics.py); the op's eager implementation forms them as the plan does."""
    g = torch.Generator().manual_seed(2)
    args = ns_args("keller", 5, compute_dtype=dtype, algorithm=algorithm)
    for x in (torch.randn(3, 24, 64, generator=g, dtype=torch.float64), torch.randn(2, 64, 24, generator=g, dtype=torch.float64)):
        exact = orthogonalize(x, dataclasses.replace(args, compute_dtype=torch.float64, algorithm="textbook"))
        forms = (ns_cost.EPILOGUE, ns_cost.POLYNOMIAL) if algorithm == "textbook" else ("auto",)
        for form in forms:
            bmm, wide = (orthogonalize(x, args, products=kind, epilogue=form) for kind in (ns_cost.BMM, ns_cost.WIDE))
            assert wide.dtype == x.dtype
            assert_rewrite_close(wide, bmm, exact, torch.bfloat16, f"fp32 products against {dtype} ({form})")
            assert_rewrite_close(bmm, wide, exact, torch.bfloat16, f"{dtype} products against fp32 ({form})")
    with config.override(cpu_rates="cpu-avx2"):
        y = newton_schulz_op(x.float(), args)
    assert torch.equal(y, orthogonalize(x.float(), args, products=ns_cost.WIDE, eager=True))


def test_compiled_step_forms_products_in_fp32_on_a_cpu_without_avx512():
    """On the profile of a CPU without AVX-512, a bf16 step's compiled products (Gram's, there) are fp32 ``bmm``
    calls on bf16 values (no bf16 product is left), and the step matches eager, whose op forms
    them alike."""
    shapes = [(24, 64)] * 3 + [(64, 24)]
    with config.override(cpu_rates="cpu-avx2"):
        compare_steps(lambda ps: muon_compile.Muon(ps, ns_dtype=torch.bfloat16), shapes, rtol=NS_RTOL["cpu"][torch.bfloat16])
        params = make_params(shapes)
        set_grads(params, 0)
        step = torch.compile(muon_compile.Muon(params).step, backend="muon")
        _, code = run_and_get_code(step)
    source = "\n".join(code)
    dtypes = dict(re.findall(r"(buf\d+) = empty_strided_cpu\(.*(torch\.\w+)\)", source))
    for new_name, old_name in re.findall(r"(buf\d+) = (buf\d+); del buf\d+  # reuse", source):
        if old_name in dtypes:
            dtypes[new_name] = dtypes[old_name]
    calls = re.findall(r"extern_kernels\.(?:bmm|baddbmm)\((.*)\)", source)
    operands = {name for call in calls for name in re.findall(r"buf\d+", call)}
    allocated = {b: dtypes[b] for b in operands if b in dtypes}  # the rest: views of these, or the step's inputs
    assert calls and allocated and set(allocated.values()) == {"torch.float32"}, allocated


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", [ns_cost.EPILOGUE, ns_cost.POLYNOMIAL])
def test_both_tall_layouts_are_the_iteration(dtype, form, device):
    """A tall matrix's textbook iterates kept in its layout or transposed (ns.evaluate.orthogonalize)
    are the same iteration, rounded differently: each as accurate against the fp64 iteration as the
    other (the rewrite rule of tests/support/numerics.py), in fp32 within fp32's NS bound of it;
    ``auto`` is the device's layout."""
    x = torch.randn(3, 64, 24, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(device)
    args = ns_args("keller", 5, compute_dtype=dtype, algorithm="textbook")
    exact = orthogonalize(x, dataclasses.replace(args, compute_dtype=torch.float64))
    layouts = {o: orthogonalize(x, args, epilogue=form, orientation=o) for o in (ns_cost.NATIVE, ns_cost.TRANSPOSED)}
    assert_rewrite_close(layouts[ns_cost.NATIVE], layouts[ns_cost.TRANSPOSED], exact, dtype, "native against transposed")
    assert_rewrite_close(layouts[ns_cost.TRANSPOSED], layouts[ns_cost.NATIVE], exact, dtype, "transposed against native")
    if dtype == torch.float32:
        for layout, y in layouts.items():
            assert_rel_close(y, exact, NS_RTOL[device][dtype], layout)
    chosen = ns_cost.choose_orientation(64, 24, dtype, torch.device(device).type).kind
    assert torch.equal(orthogonalize(x, args, epilogue=form), layouts[chosen])

"""The Newton–Schulz op: semantics against an independent fp64 reference, the NS
property, batching, orientation, presets, opcheck and bad input."""

import math

import pytest
import torch

import muon_compile
from muon_compile.ns import coefficients as coeffs
from muon_compile.ns.args import NSArgs
from muon_compile.ns.op import NEWTON_SCHULZ, newton_schulz_op

from numerics import NS_RTOL, assert_rel_close, textbook_ns

KELLER = coeffs.PRESETS["keller"]
POLAR = coeffs.PRESETS["polar_express"]


def scalar_composition(sigma, triples, steps):
    """The quintic applied to singular values: NS(U S V^T) = U p(S) V^T."""
    for i in range(steps):
        a, b, c = triples[min(i, len(triples) - 1)]
        sigma = a * sigma + b * sigma**3 + c * sigma**5
    return sigma


def call(x, preset, steps, dtype, eps=None, clamp=False, algorithm="auto"):
    args = NSArgs.repeating(
        preset.coefficients, steps, eps=preset.eps if eps is None else eps,
        norm_scale=preset.norm_scale, clamp_eps=clamp, compute_dtype=dtype, algorithm=algorithm,
    )
    return newton_schulz_op(x, args)


SHAPES = [(16, 48), (48, 16), (24, 24), (1, 9), (9, 1)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("preset", [KELLER, POLAR], ids=["keller", "polar_express"])
@pytest.mark.parametrize("steps", [1, 5, 10])
@pytest.mark.parametrize("algorithm", ["textbook", "gram"])
def test_matches_textbook_fp64(device, shape, preset, steps, algorithm):
    """Both evaluations are the textbook iteration in exact arithmetic (fp64 here)."""
    g = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    got = call(g, preset, steps, torch.float64, algorithm=algorithm)
    want = textbook_ns(g, preset.coefficients, steps, preset.eps, preset.norm_scale)
    assert got.shape == g.shape and got.dtype == g.dtype and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("preset", [KELLER, POLAR], ids=["keller", "polar_express"])
def test_singular_values_follow_the_polynomial(device, preset):
    """NS acts on singular values one by one: svd(NS(G)) = p∘...∘p(svd(G) / scaled norm)."""
    g = torch.randn(20, 36, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
    sigma = torch.linalg.svdvals(g) / (g.norm() * preset.norm_scale + preset.eps)
    want = torch.sort(scalar_composition(sigma, preset.coefficients, 5).abs()).values
    got = torch.sort(torch.linalg.svdvals(call(g, preset, 5, torch.float64))).values
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("preset", [KELLER, POLAR], ids=["keller", "polar_express"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ns_property_band(device, preset, dtype):
    """Output singular values lie in the band the scalar polynomial predicts (fp64),
    widened by the stated tolerance of the compute dtype."""
    g = torch.randn(4, 32, 96, generator=torch.Generator().manual_seed(2)).to(device)
    out = call(g, preset, 5, dtype).double()
    for gi, oi in zip(g.double(), out):
        sigma = torch.linalg.svdvals(gi) / (gi.norm() * preset.norm_scale + preset.eps)
        predicted = scalar_composition(sigma, preset.coefficients, 5)
        lo, hi = predicted.min().item(), predicted.max().item()
        got = torch.linalg.svdvals(oi)
        slack = 2 * NS_RTOL[device][dtype]
        assert lo - slack <= got.min().item() and got.max().item() <= hi + slack, (lo, hi, got)
        assert 0.5 < lo and hi < 1.5  # the orthogonalisation really happened


def test_batched_equals_per_matrix(device):
    # float64: cuBLAS multiplies a batch of 5 and one matrix with different kernels, whose
    # fp32 results differ by about 10 ulps after 5 iterations (1.19e-6 measured on an
    # H100); matrices mixed or normalised together would be off by O(1) in any dtype
    g = torch.randn(5, 12, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).to(device)
    batched = call(g, KELLER, 5, torch.float64)
    for i in range(5):
        assert_rel_close(batched[i], call(g[i], KELLER, 5, torch.float64), 1e-12, f"matrix {i}")


def test_tall_is_transpose_of_wide(device):
    # two layouts of one matrix: the BLAS may take other kernels (another summation order)
    # for each, so within fp32 Newton-Schulz's bound, not bit for bit
    g = torch.randn(40, 12, generator=torch.Generator().manual_seed(4)).to(device)
    got, want = call(g, KELLER, 5, torch.float32), call(g.T.contiguous(), KELLER, 5, torch.float32).T
    assert_rel_close(got, want, NS_RTOL[device][torch.float32])


def test_output_dtype_follows_input_compute_dtype_is_used(device):
    g = torch.randn(8, 16, generator=torch.Generator().manual_seed(5)).to(device)
    out = call(g, KELLER, 5, torch.bfloat16)
    assert out.dtype == torch.float32
    # the values are bf16-representable: the iteration ran in bf16
    assert torch.equal(out, out.bfloat16().float())


def test_zero_matrix_gives_zero_not_nan(device):
    for clamp in (False, True):
        out = call(torch.zeros(4, 6, device=device), KELLER, 5, torch.float32, clamp=clamp)
        assert torch.equal(out, torch.zeros(4, 6, device=device))


def test_clamp_eps_divides_by_max():
    g = torch.full((2, 2), 1e-9, dtype=torch.float64)
    # norm = 2e-9 < eps: clamp divides by eps, add divides by norm + eps
    out_clamp = call(g, KELLER, 1, torch.float64, eps=1e-3, clamp=True)
    out_add = call(g, KELLER, 1, torch.float64, eps=1e-3, clamp=False)
    torch.testing.assert_close(out_clamp, _one_step(g / 1e-3))
    torch.testing.assert_close(out_add, _one_step(g / (2e-9 + 1e-3)))


def _one_step(x):
    a, b, c = KELLER.coefficients[0]
    gram = x @ x.T
    return a * x + (b * gram + c * gram @ gram) @ x


def test_presets_table():
    assert KELLER.coefficients == ((3.4445, -4.7750, 2.0315),) and KELLER.norm_scale == 1.0
    a, b, c = POLAR.coefficients[0]
    assert math.isclose(a, 8.28721201814563 / 1.01) and math.isclose(b, -23.595886519098837 / 1.01**3)
    assert math.isclose(c, 17.300387312530933 / 1.01**5)
    assert POLAR.coefficients[-1] == (1.875, -1.25, 0.375) and POLAR.norm_scale == 1.01
    assert len(POLAR.coefficients) == 8
    assert POLAR.schedule(10)[9] == (1.875, -1.25, 0.375)


def test_public_function_resolves_presets_and_custom():
    g = torch.randn(8, 12, generator=torch.Generator().manual_seed(6))
    custom = muon_compile.newton_schulz(g, [(3.0, -3.2, 1.2), (2.0, -1.5, 0.5)], 3, compute_dtype=torch.float32)
    want = textbook_ns(g, ((3.0, -3.2, 1.2), (2.0, -1.5, 0.5)), 3, 1e-7, 1.0)
    assert_rel_close(custom, want, 1e-5)
    triple = muon_compile.newton_schulz(g, (3.4445, -4.7750, 2.0315), 5, compute_dtype=torch.float32)
    assert torch.equal(triple, muon_compile.newton_schulz(g, "keller", 5, compute_dtype=torch.float32))


@pytest.mark.parametrize(
    "x",
    [torch.randn(6, 10), torch.randn(10, 6), torch.randn(3, 6, 10), torch.randn(4, 4, dtype=torch.bfloat16)],
    ids=["wide", "tall", "batched", "bf16"],
)
def test_opcheck(device, x):
    args = NSArgs.repeating(POLAR.coefficients, 5, norm_scale=1.01, compute_dtype=torch.float32)
    torch.library.opcheck(NEWTON_SCHULZ, (x.to(device), *args.to_op()))


@pytest.mark.parametrize(
    "x, kwargs, match",
    [
        (torch.randn(5), {}, "2-D matrix or a 3-D batch"),
        (torch.randn(2, 3, 4, 5), {}, "2-D matrix or a 3-D batch"),
        (torch.randn(3, 3, dtype=torch.complex64), {}, "real floating-point"),
        (torch.ones(3, 3, dtype=torch.int64), {}, "real floating-point"),
        (torch.randn(3, 3), {"coefficients": "nope"}, "unknown Newton-Schulz coefficient preset 'nope'"),
        (torch.randn(3, 3), {"coefficients": (1.0, 2.0)}, r"expected a triple"),
        (torch.randn(3, 3), {"coefficients": [(1.0, 2.0, float("nan"))]}, "finite"),
        (torch.randn(3, 3), {"steps": 0}, "steps must be >= 1"),
        (torch.randn(3, 3), {"compute_dtype": torch.int32}, "compute_dtype"),
        (torch.randn(3, 3), {"eps": -1.0}, "eps must be >= 0"),
    ],
)
def test_bad_input_raises_value_error(x, kwargs, match):
    with pytest.raises(ValueError, match=match):
        muon_compile.newton_schulz(x, **kwargs)


def test_flat_coefficients_must_be_triples():
    with pytest.raises(ValueError, match="3\\*k values"):
        NEWTON_SCHULZ(torch.randn(3, 3), [1.0, 2.0, 3.0, 4.0], 5, 1e-7, 1.0, False, torch.float32, "auto")


def test_backpropagating_through_the_op_is_an_error():
    x = torch.randn(4, 6, requires_grad=True)
    y = muon_compile.newton_schulz(x, compute_dtype=torch.float32)
    with pytest.raises(RuntimeError, match="has no derivative"):
        y.sum().backward()


def test_rounding_cast_is_a_plain_cast(device):
    from muon_compile.ns.rounding_cast import to_low_precision

    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(7)).to(device)
    assert torch.equal(to_low_precision(x, torch.bfloat16), x.to(torch.bfloat16))
    torch.library.opcheck(torch.ops.muon_compile.rounding_cast.default, (x, torch.bfloat16))


def test_compiled_bf16_op_rounds_where_eager_rounds(device):
    """backend="muon" lowers the op into the graph; its bf16 result stays within the bf16
    bound of eager on each of 20 matrices. Without muon_compile/ns/rounding_cast.py, torch 2.11's
    CPU code skipped the input's bf16 rounding: errors up to 0.082 on these inputs."""
    x = torch.randn(20, 5, 7, generator=torch.Generator().manual_seed(8)).to(device)
    args = NSArgs.repeating(POLAR.coefficients, 5, norm_scale=POLAR.norm_scale, compute_dtype=torch.bfloat16)
    got = torch.compile(lambda t: newton_schulz_op(t, args), backend="muon")(x)
    want = newton_schulz_op(x, args)
    for i in range(x.size(0)):
        assert_rel_close(got[i], want[i], NS_RTOL[device][torch.bfloat16], f"matrix {i}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_eager_polynomial_in_place_rounds_as_the_traced_expression(device, dtype):
    """The op's eager implementation forms the polynomial ``c A A + b A + a I`` in place
    (ns.evaluate.polynomial without ``eye``), the traced forms as written: the same roundings
    by construction (each product with its scalar rounded to fp32, summed, ``a`` added to the
    diagonal where the identity adds it and an exact 0 elsewhere; the CPU's traced form adds it
    on the diagonal alone), so every element is equal; its operands are left as they were."""
    from muon_compile.ns.evaluate import DIAGONAL, identity, polynomial

    g = torch.Generator().manual_seed(9)
    A, AA = (torch.randn(3, 24, 24, generator=g).to(device, dtype) for _ in range(2))
    operands = (A.clone(), AA.clone())
    a, b, c = POLAR.coefficients[0]
    traced = polynomial(A, AA, (a, b, c), torch.float32, dtype, identity(24, A.device, torch.float32))
    in_place = polynomial(A, AA, (a, b, c), torch.float32, dtype, None)
    on_diagonal = polynomial(A, AA, (a, b, c), torch.float32, dtype, DIAGONAL)
    assert in_place.dtype == on_diagonal.dtype == dtype and torch.equal(in_place, traced) and torch.equal(on_diagonal, traced)
    assert torch.equal(A, operands[0]) and torch.equal(AA, operands[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", [(3, 12, 40), (2, 40, 12)], ids=["wide", "tall"])
@pytest.mark.parametrize("scale", [1.0, 1e-30], ids=["plain norm", "rescaled norm"])
def test_eager_kernel_computes_what_the_traced_loop_computes(shape, dtype, scale):
    """On the CPU the op's eager implementation takes the norms without their rescaled copies where
    none is needed, divides in place where it owns the copy, and runs the polynomial form's
    iterations in buffers allocated once (ns.evaluate.normalized, frobenius_norm,
    polynomial_in_buffers): the same operations and roundings as what the lower pass traces,
    so the same result to the bit (also of an input whose squares underflow fp32, whose norm
    is taken rescaled), and its input left as it was."""
    from muon_compile.ns.evaluate import orthogonalize

    x = torch.randn(*shape, generator=torch.Generator().manual_seed(10)) * scale
    before = x.clone()
    args = NSArgs.repeating(POLAR.coefficients, 5, norm_scale=POLAR.norm_scale, compute_dtype=dtype)
    traced = orthogonalize(x, args, epilogue="off")
    eager = orthogonalize(x, args, epilogue="off", eager=True)
    assert torch.equal(eager, traced) and torch.equal(x, before)
    # the rescaled case takes the rescaled norms: its entries' squares underflow fp32
    assert bool((torch.linalg.vector_norm(x, dim=(-2, -1)) < 2.0**-60).all()) == (scale < 1)

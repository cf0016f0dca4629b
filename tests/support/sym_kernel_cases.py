"""The symmetric product kernel's cases, run by ``tests/kernels/test_sym_kernel.py`` in a process of
their own under Triton's interpreter (``TRITON_INTERPRET=1`` must be set before Triton is
imported, which another test's import of Inductor may already have done in a test process).

``python tests/support/sym_kernel_cases.py small|large``: checks every case of the set against the
exact product (:func:`check`, whose bound the test module's docstring states) and exits 1 on
the first failure, naming it. ``... ns``: Newton–Schulz with its symmetric products through
the op (:func:`newton_schulz_cases`)."""

import sys

import torch

ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
SMALL = [(1, 1, 1), (2, 5, 7), (3, 33, 70), (1, 130, 40), (64, 24, 17), (64, 64, 48)]
LARGE = [(1, 1023, 511), (1, 4096, 4096)]  # 4096 in bf16 only (the interpreter takes 6 s a dtype)


def operands(batch, m, k, dtype, square):
    """``(a, b)`` with a symmetric product: ``X, X^T`` (a strided view), or ``S, S``."""
    g = torch.Generator().manual_seed(batch * 7919 + m * 31 + k)
    if square:
        s = torch.randn(batch, m, m, generator=g)
        a = (s + s.mT).to(dtype)
        return a, a
    a = torch.randn(batch, m, k, generator=g).to(dtype)
    return a, a.mT


def check(c, a, b, input=None, beta=1.0, alpha=1.0):
    """``c`` is ``a @ b`` (with ``input``: ``beta * input + alpha * (a @ b)``) to the bound of
    the test module's docstring, and exactly symmetric."""
    exact = torch.bmm(a.double(), b.double())
    k = a.shape[-1]
    # (|a| @ |b|)_ij <= ||a_i|| ||b_j|| (Cauchy-Schwarz): the fp32 summation's bound without a second product
    magnitude = a.double().norm(dim=-1).unsqueeze(-1) * b.double().norm(dim=-2).unsqueeze(-2)
    if input is not None:  # the epilogue's three fp32 roundings, at most 2^-24 of each term's magnitude
        terms = abs(alpha) * magnitude + abs(beta) * input.double().abs()
        exact = alpha * exact + beta * input.double()
        magnitude = abs(alpha) * magnitude + 3 * terms / k
    bound = ULP[a.dtype] * exact.abs() + k * 2.0**-24 * magnitude
    assert c.shape == exact.shape and c.dtype == a.dtype, (c.shape, c.dtype)
    excess = (c.double() - exact).abs() - bound
    assert excess.max() <= 0, f"worst excess {excess.max().item():.3g} over the bound"
    assert torch.equal(c, c.mT), "the result is not exactly symmetric"


def newton_schulz_cases():
    """The op runs the kernel in eager code on the CPU under the interpreter (bitwise
    :func:`launch`'s result) and bmm in compiled code; a bf16 Newton–Schulz evaluation (the
    textbook iteration and Gram's, fp16) with its symmetric products through it is as
    accurate as the one with ``bmm`` against the exact (fp64) evaluation
    (``SAME_ROUNDING_MARGIN``, tests/support/numerics.py). A compiled step that asks for them runs
    (its generated code calls bmm on the CPU) and equals eager (``NS_RTOL``)."""
    from numerics import NS_RTOL, SAME_ROUNDING_MARGIN, rel_err

    from muon_compile import Muon, config
    from muon_compile.kernels import sym as sym_kernel
    from muon_compile.ns.coefficients import ns_args
    from muon_compile.ns.cost import BMM, SYMMETRIC
    from muon_compile.ns.evaluate import orthogonalize

    launched = []
    launch = sym_kernel.launch
    sym_kernel.launch = lambda *args, **kwargs: launched.append(args[0].shape) or launch(*args, **kwargs)
    a, b = operands(2, 40, 72, torch.bfloat16, False)
    assert torch.equal(sym_kernel.sym_bmm(a, b), launch(a, b)) and launched == [a.shape]
    compiled = torch.compile(lambda t: sym_kernel.sym_bmm(t, t.mT))
    assert torch.equal(compiled(a), torch.bmm(a, b)) and launched == [a.shape]
    g = torch.Generator().manual_seed(0)
    checked = 0
    # Polar Express at 128 x 384: where Gram squaring R = Z (Z R) by the kernel (symmetric to
    # its rounding only) doubled the error (see ns.evaluate.gram_iteration)
    cases = [("keller", (3, 64, 256)), ("keller", (2, 96, 96)), ("keller", (1, 130, 40)), ("polar_express", (1, 128, 384))]
    for preset, shape in cases:
        x = torch.randn(shape, generator=g)
        for algorithm in ("textbook", "gram"):
            args = ns_args(preset, 5, compute_dtype=torch.bfloat16, algorithm=algorithm)
            exact = orthogonalize(x.double(), ns_args(preset, 5, compute_dtype=torch.float64), "textbook")
            sym = rel_err(orthogonalize(x, args, algorithm, products=SYMMETRIC), exact)
            plain = rel_err(orthogonalize(x, args, algorithm, products=BMM), exact)
            assert sym <= SAME_ROUNDING_MARGIN * plain, (shape, algorithm, sym, plain)
            checked += 1
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in ((48, 16), (16, 48), (32, 32))]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, q in zip(params, twins):
        p.grad = torch.randn(p.shape, generator=g)
        q.grad = p.grad.clone()
    before = [p.detach().clone() for p in params]
    eager, step = Muon(params, lr=0.02), torch.compile(Muon(twins, lr=0.02).step, backend="muon")
    with config.override(sym_products="on"):
        eager.step()
        step()
    for p, q, p0 in zip(params, twins, before):
        assert rel_err(q.detach() - p0, p.detach() - p0) <= NS_RTOL["cpu"][torch.bfloat16]
    print(f"ok: {checked} evaluations and a compiled step")
    return 0


def main(which):
    from muon_compile.kernels import sym as sym_kernel

    if which == "ns":
        return newton_schulz_cases()
    cases = SMALL if which == "small" else LARGE
    squares = (False, True) if which == "small" else (False,)
    # the kernel's own tiles, and 16 x 16 ones, so small matrices span several tiles (masked
    # edges, mirrored tiles); the largest use 1024 x 1024, so the interpreter's Python loop stays
    # short: what is checked (tiling, masks, the mirror) is the same at any tile size; and 16 x 16
    # for batches of a few matrices only (a batch's entries are launched alike: 64 adds 10 s)
    launches = (None, sym_kernel.Tiles(16, 16)) if which == "small" else (sym_kernel.Tiles(1024, 1024),)
    checked = 0
    for batch, m, k in cases:
        for dtype in sym_kernel.DTYPES if m < 4096 else (torch.bfloat16,):
            for square in squares:
                a, b = operands(batch, m, k, dtype, square)
                for tiles in launches[: 1 if batch > 8 or batch * m * m * k > 10**6 else None]:
                    try:
                        check(sym_kernel.launch(a, b, tiles), a, b)
                        checked += 1
                        if square and tiles is not None:  # the textbook iteration's B = b A + c A A, over several tiles
                            got = sym_kernel.launch(a, b, tiles, input=a, beta=-4.775, alpha=2.0315)
                            check(got, a, b, a, -4.775, 2.0315)
                            checked += 1
                    except AssertionError as e:
                        print(f"FAILED {batch}x{m}x{k} {dtype} {'square' if square else 'gram'} {tiles}: {e}")
                        return 1
    if which == "small":  # a batch larger than one launch takes (the limit lowered to 2 here)
        sym_kernel.MAX_BATCH_PER_LAUNCH = 2
        a, b = operands(5, 20, 9, torch.float16, False)
        check(sym_kernel.launch(a, b, sym_kernel.Tiles(16, 16)), a, b)
        checked += 1
    empty = torch.zeros(2, 6, 0, dtype=torch.bfloat16)
    assert torch.equal(sym_kernel.launch(empty, empty.mT), torch.zeros(2, 6, 6, dtype=torch.bfloat16))
    print(f"ok: {checked} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

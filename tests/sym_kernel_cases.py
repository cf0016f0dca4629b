"""The symmetric product kernel's cases, run by ``tests/test_sym_kernel.py`` in a process of
their own under Triton's interpreter (``TRITON_INTERPRET=1`` must be set before Triton is
imported, which another test's import of Inductor may already have done in a test process).

``python tests/sym_kernel_cases.py small|large``: checks every case of the set against the
exact product (:func:`check`, whose bound the test module's docstring states) and exits 1 on
the first failure, naming it."""

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


def check(c, a, b):
    """``c`` is ``a @ b`` to the bound of the test module's docstring, and exactly symmetric."""
    exact = torch.bmm(a.double(), b.double())
    k = a.shape[-1]
    # (|a| @ |b|)_ij <= ||a_i|| ||b_j|| (Cauchy-Schwarz): the fp32 summation's bound without a second product
    magnitude = a.double().norm(dim=-1).unsqueeze(-1) * b.double().norm(dim=-2).unsqueeze(-2)
    bound = ULP[a.dtype] * exact.abs() + k * 2.0**-24 * magnitude
    assert c.shape == exact.shape and c.dtype == a.dtype, (c.shape, c.dtype)
    excess = (c.double() - exact).abs() - bound
    assert excess.max() <= 0, f"worst excess {excess.max().item():.3g} over the bound"
    assert torch.equal(c, c.mT), "the result is not exactly symmetric"


def main(which):
    from muon_compile import sym_kernel

    cases = SMALL if which == "small" else LARGE
    squares = (False, True) if which == "small" else (False,)
    # the kernel's own tiles, and 16 x 16 ones, so small matrices span several tiles (masked
    # edges, mirrored tiles); the largest use 1024 x 1024, so the interpreter's Python loop stays
    # short: what is checked (tiling, masks, the mirror) is the same at any tile size
    launches = (None, sym_kernel.Tiles(16, 16)) if which == "small" else (sym_kernel.Tiles(1024, 1024),)
    checked = 0
    for batch, m, k in cases:
        for dtype in sym_kernel.DTYPES if m < 4096 else (torch.bfloat16,):
            for square in squares:
                a, b = operands(batch, m, k, dtype, square)
                for tiles in launches[: 1 if batch * m * m * k > 10**6 else None]:  # 16 x 16: small ones
                    try:
                        check(sym_kernel.launch(a, b, tiles), a, b)
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

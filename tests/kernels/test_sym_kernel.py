"""The symmetric product kernel (muon_compile/kernels/sym.py, issue 62): its results against
the exact product, on this CPU through Triton's interpreter (``tests/support/sym_kernel_cases.py``,
in a process of its own with TRITON_INTERPRET=1), with and without the ``baddbmm`` epilogue;
Newton–Schulz through it; and the op around it: shapes, fake implementation, the
``bmm``/``baddbmm`` fallback off CUDA, and a compiled call.

The bound. The kernel sums the products of a tile in fp32 (bf16 / fp16 products are exact
there) and rounds the sum once to the output dtype, as ``bmm`` does, in another order. So,
against the exact (fp64) product ``P`` of the same operands, each entry is within half an
ulp of the dtype (2^-8 relative for bf16, 2^-11 for fp16) of ``P`` plus the fp32 summation's
error, at most ``k * 2^-24`` times the sum of the products' magnitudes ``(|a| @ |b|)``
(the standard bound for ``k`` terms; the check takes the larger ``||a_i|| ||b_j||``, which
needs no second product); it allows the dtype's full ulp (2^-7, 2^-10)
for the half-ulp term, so ties stay inside. The result must also be exactly symmetric,
which ``bmm``'s need not be: the kernel stores each element below the diagonal from the value
it stores above it, diagonal tiles included, so this holds by construction whatever the
``dot`` underneath rounds; the cases run under two BLAS kernels for the interpreter's ``dot``
(``helpers.BLAS_KERNELS``), one of which rounds a tile's mirrored entries apart.
"""


import pytest
import torch

from muon_compile.kernels import sym as sym_kernel

from helpers import BLAS_KERNELS, run_interpreted
from script_runs import SUPPORT
from sym_kernel_cases import SMALL, check, operands

triton = pytest.importorskip("triton", reason="the kernel's tests need Triton (pip install triton)")
# Triton before 3.7 (torch 2.11's 3.6) runs a loop over a runtime bound in its interpreter by
# int() of a one-element array, which numpy 2 refuses: the kernel itself is not at fault
OLD_INTERPRETER = tuple(int(p) for p in triton.__version__.split(".")[:2]) < (3, 7)
interpreter = pytest.mark.skipif(OLD_INTERPRETER, reason=f"Triton {triton.__version__}'s interpreter fails under numpy 2")

CASES = SUPPORT / "sym_kernel_cases.py"


def _interpreted(which, env=None):
    return run_interpreted(CASES, which, env=env)


# each case's exact symmetry, whatever numpy's BLAS (the interpreter's tl.dot) rounds
blas_kernels = pytest.mark.parametrize("blas", BLAS_KERNELS.values(), ids=BLAS_KERNELS.keys())


@pytest.mark.slow
@interpreter
@blas_kernels
def test_kernel_equals_the_exact_product_to_its_rounding(blas):
    """1x1 to 130x130, odd sizes, batches of 1 and 64, bf16 and fp16, X X^T through a strided
    view and the square of a symmetric matrix, with the kernel's tiles and 16 x 16 ones; a
    batch launched in parts; an empty inner dimension."""
    assert "ok: 49 cases" in _interpreted("small", blas)


@pytest.mark.slow
@interpreter
@blas_kernels
def test_kernel_on_large_and_odd_matrices(blas):
    """1023 x 511 in bf16 and fp16, 4096 x 4096 in bf16."""
    assert "ok: 3 cases" in _interpreted("large", blas)


@pytest.mark.slow
@interpreter
def test_newton_schulz_through_the_kernel_is_as_accurate_as_with_bmm():
    """The op runs the kernel on the CPU under the interpreter (eager code only); bf16
    Newton–Schulz, textbook and Gram, with its products through it, against the exact
    evaluation; a compiled step asking for them."""
    assert "ok: 8 evaluations and a compiled step" in _interpreted("ns")


def test_op_falls_back_to_bmm_off_cuda_and_has_a_fake_implementation():
    """On the CPU the op is ``bmm`` exactly; its fake implementation gives the shape; bad
    operands are refused by name; a compiled call works."""
    x = torch.randn(3, 8, 12).to(torch.bfloat16)
    assert torch.equal(sym_kernel.sym_bmm(x, x.mT), torch.bmm(x, x.mT))
    s = sym_kernel.sym_bmm(x, x.mT)
    assert torch.equal(sym_kernel.sym_bmm(s, s, s, -4.775, 2.0315), torch.baddbmm(s, s, s, beta=-4.775, alpha=2.0315))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
        assert sym_kernel.sym_bmm(fake, fake.mT).shape == (3, 8, 8)
    with pytest.raises(ValueError, match=r"a \[B, m, k\] and b \[B, k, m\]"):
        sym_kernel.sym_bmm(x, x)
    with pytest.raises(ValueError, match=r"an input \[B, m, m\]"):
        sym_kernel.sym_bmm(x, x.mT, x)
    compiled = torch.compile(lambda t: sym_kernel.sym_bmm(t, t.mT) * 2)
    assert torch.equal(compiled(x), torch.bmm(x, x.mT) * 2)


@pytest.mark.cuda
def test_op_on_cuda_runs_the_kernel():
    """On CUDA the op runs the kernel (eager and inside compiled code), to the same bound."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for dtype in sym_kernel.DTYPES:
        for batch, m, k in [*SMALL, (4, 1024, 4096)]:
            a, b = operands(batch, m, k, dtype, square=False)
            check(sym_kernel.sym_bmm(a.cuda(), b.cuda()).cpu(), a, b)
            s, _ = operands(batch, m, k, dtype, square=True)
            check(sym_kernel.sym_bmm(s.cuda(), s.cuda(), s.cuda(), -4.775, 2.0315).cpu(), s, s, s, -4.775, 2.0315)
            compiled = torch.compile(lambda t: sym_kernel.sym_bmm(t, t.mT))
            check(compiled(a.cuda()).cpu(), a, b)

"""The numeric tolerances of the test suite, stated once.

Compiled results are compared with eager execution of the same code by the relative
Frobenius error ``||got - want|| / ||want||`` of each parameter's update.

* fp32 Newton–Schulz: ``1e-4``. fp32's unit roundoff is 6e-8; the compiled step sums the
  norm in another order and batches the matmuls, and each quintic iteration can
  amplify a relative error by up to its slope at zero (a = 3.4445 for Keller, up to 8.3
  for Polar Express), five times over: 6e-8 * 3.45**5 = 3e-5, with a 3x margin.
  Observed (``python scripts/stress_numerics.py``, 300 updates per preset): at most
  4.9e-6, i.e. an input perturbation of ~1e-7 came out ~50x larger.
* bf16 Newton–Schulz: ``5e-2``. The compiled step rounds at the same points as eager
  (same bmm kernels; ``emulate_precision_casts`` keeps the bf16 casts), so the one
  remaining difference is the fp32 norm's summation order, which can flip the bf16
  rounding of an entry of the normalised input that lies at a rounding boundary. One
  flip is one ulp (2**-8) of one of N entries; with the ~50x amplification measured in
  fp32 that is 50 * 2**-8 / sqrt(N) = 2.4e-2 for the N = 64 entries of our smallest
  test matrix, doubled for margin. Observed: 0 (300 of 300 updates bitwise equal).

On CUDA (tolerances per device: ``NS_RTOL[device][dtype]``) the same two bounds hold, for
the same reasons: fp32 matmuls stay fp32 (TF32 is off unless a user turns it on), eager
and compiled bf16 products are the same cuBLAS calls, and Triton code honours
``emulate_precision_casts``; what differs is more freedom in summation order (cuBLAS may
split the inner dimension differently for a batch than for one matrix; Triton reductions
are tree-shaped), which moves fp32 accumulations by a few units of fp32 roundoff and so
can flip a bf16 rounding as on the CPU. On one H100 (torch 2.11, 2026-11-26) every
comparison with these tolerances held; the one test that failed on a tolerance had its
own (fp32 batched against per-matrix at 1e-6, 1.19e-6 measured; docs/benchmarks.md, "GPU").

Anything without Newton–Schulz in it (AdamW, momentum) is compared at fp32 precision
(``FP32_RTOL``), as are two compiled programs that should compute the same step (with and
without state offload): the generated code may order a row reduction differently in each,
1-2 ulp of NorMuon's second moment on an H200 (docs/benchmarks.md); a CPU's code splits
its reductions by the thread count and the vector width, which differ by machine.

Rewritten code (the canonicalize pass turns a user's own Newton–Schulz loop, e.g.
torch.optim.Muon's, into the op) cannot round where the user's bf16 code rounds: the op
sums ``a I + b A + c A^2`` in fp32 and rounds once, the user's code rounds after its own
products and sums. Neither is the more accurate in general, so a rewritten bf16 result
is compared with the *exact* result of the same code (evaluated in fp64) and must be
about as accurate as eager's own bf16 result:
``err(compiled, exact) <= max(5e-2, 2 * err(eager, exact))`` (``assert_rewrite_close``).
Measured (``python scripts/stress_numerics.py --rewrites --steps 50``: the four forms of
tests/support/ns_forms.py on the mixed shapes, 500 results each), ``err(compiled) / err(eager)``
has median 0.45 (Keller), 0.51 (Polar Express), 1.02 (torch.optim.Muon's addmm form),
0.75 (cubic) and maximum 2.93; the largest share of the bound any result used was 0.90
(Polar Express, whose first step amplifies rounding 8x). fp32 is compared with eager
directly at ``1e-4`` as above.

bf16 *parameters* are compared directly, not through their update: an update of lr * O
(about 0.006 here) is one or two bf16 ulps of a parameter near 1, and the eager step
rounds twice (``mul_`` for weight decay, then ``add_``) where the compiled step fuses
both and rounds once. So each parameter may differ by one ulp: ``rtol = 2**-7`` (bf16
keeps 8 significant bits), plus an ``atol`` of the update's own NS tolerance.

Symmetric products (``muon_compile.kernels.sym``, through Triton's interpreter here) round
where ``bmm`` rounds and sum in another order, so a Newton–Schulz evaluation with them must
be as accurate as with ``bmm``: ``err(sym, exact) <= 1.25 * err(bmm, exact)``
(``SAME_ROUNDING_MARGIN``). Measured on the cases of tests/support/sym_kernel_cases.py (bf16, 3
shapes, textbook and Gram): 0.99 to 1.10. What the margin catches: one more bf16 rounding
per iteration (``B = b A + c A A`` outside the product's epilogue) gave 2.5x, the
interpreter's rounding toward zero 1.7x, Gram squaring an ``R`` symmetric to its rounding
only 1.7x (Polar Express).
"""

import functools

import torch
from torch.overrides import TorchFunctionMode

_NS_RTOL_CPU = {torch.float32: 1e-4, torch.bfloat16: 5e-2}
NS_RTOL = {"cpu": _NS_RTOL_CPU, "cuda": dict(_NS_RTOL_CPU)}
FP32_RTOL = 1e-5
BF16_PARAM_RTOL = 2**-7


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """``||got - want||_F / ||want||_F`` in float64 (0 when both are zero)."""
    got, want = got.double(), want.double()
    denom = want.norm().item()
    diff = (got - want).norm().item()
    return diff / denom if denom > 0 else diff


def assert_rel_close(got: torch.Tensor, want: torch.Tensor, rtol: float, what: str = "") -> None:
    err = rel_err(got, want)
    assert err <= rtol, f"{what}: relative error {err:.3g} > {rtol:.3g}"


REWRITE_MARGIN = 2.0
SAME_ROUNDING_MARGIN = 1.25


def assert_rewrite_close(got, eager, exact, dtype, what=""):
    """A rewritten Newton–Schulz result: fp32 against eager; bf16 (or fp16) at least as
    accurate as eager's own against the exact (fp64) evaluation of the same code (see the
    module docstring; fp16 keeps 3 more bits than bf16, so bf16's floor covers it)."""
    rtol = NS_RTOL[got.device.type]
    if dtype not in (torch.bfloat16, torch.float16):
        assert_rel_close(got, eager, rtol[dtype], what)
        return
    bound = max(rtol[torch.bfloat16], REWRITE_MARGIN * rel_err(eager, exact))
    assert_rel_close(got, exact, bound, f"{what} (eager's own error {rel_err(eager, exact):.3g})")


class Bf16AsFp64(TorchFunctionMode):
    """The exact evaluation of code that hard-codes bf16 (``G.bfloat16()``, ``X.to(torch.bfloat16)``,
    ``dtype=torch.bfloat16``), as a package or a corpus entry spells it: the same code with every
    bf16 cast and bf16 allocation made fp64."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.bfloat16:
            return args[0].double()
        args = tuple(torch.float64 if a is torch.bfloat16 else a for a in args)
        kwargs = {k: torch.float64 if v is torch.bfloat16 else v for k, v in kwargs.items()}
        return func(*args, **kwargs)


def exact_step(step):
    """``step`` evaluated exactly: run under :class:`Bf16AsFp64`."""

    @functools.wraps(step)
    def run(*args, **kwargs):
        with Bf16AsFp64():
            return step(*args, **kwargs)

    return run


def textbook_ns(g, triples, steps, eps, norm_scale):
    """Newton–Schulz written out in float64, independent of the package's code: the reference
    the op and the optimizers are checked against."""
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (x.norm() * norm_scale + eps)
    for i in range(steps):
        a, b, c = triples[min(i, len(triples) - 1)]
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def assert_updates_close(got, want, start, rtol, what="", names=None):
    """Each tensor's change from ``start`` (the update, not the weights it sits on) within
    ``rtol`` of the reference's change; ``rtol`` a float or one per tensor, ``names`` the
    tensors' names in the message (their index and shape otherwise)."""
    rtols = rtol if isinstance(rtol, (list, tuple)) else [rtol] * len(want)
    assert len(got) == len(want) == len(start) == len(rtols), (len(got), len(want), len(start), len(rtols))
    for i, (g, w, s, r) in enumerate(zip(got, want, start, rtols)):
        label = names[i] if names is not None else f"{i} {tuple(w.shape)}"
        assert_rel_close(g - s, w - s, r, f"{what} {label}".strip())

"""The numeric tolerances of the test suite, stated once.

Compiled results are compared with eager execution of the same code by the relative
Frobenius error ``||got - want|| / ||want||`` of each parameter's update.

* fp32 Newton–Schulz: ``1e-4``. fp32's unit roundoff is 6e-8; the compiled step sums the
  norm in another order and multiplies in other blocks, and each quintic iteration can
  amplify a relative error by up to its slope at zero (a = 3.4445 for Keller, up to 8.3
  for Polar Express), five times over: 6e-8 * 3.45**5 = 3e-5, with a 3x margin.
  Observed: at most 4.3e-6.
* bf16 Newton–Schulz: ``5e-2``. bf16's unit roundoff is 2**-8 = 3.9e-3; fused and
  unfused prologues may round one entry of the normalised input differently, and that
  one-ulp difference grows by up to the slope (3.45) in each of the first iterations
  before the iteration contracts: 3.9e-3 * 3.45**2 = 4.6e-2. Observed: 0 to 1.5e-2.

Anything without Newton–Schulz in it (AdamW, momentum) is compared at fp32 precision.

bf16 *parameters* are compared directly, not through their update: an update of lr * O
(about 0.006 here) is one or two bf16 ulps of a parameter near 1, and the eager step
rounds twice (``mul_`` for weight decay, then ``add_``) where the compiled step fuses
both and rounds once. So each parameter may differ by one ulp: ``rtol = 2**-7`` (bf16
keeps 8 significant bits), plus an ``atol`` of the update's own NS tolerance.
"""

import torch

NS_RTOL = {torch.float32: 1e-4, torch.bfloat16: 5e-2}
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

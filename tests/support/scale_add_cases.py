"""The stacked write's kernel (muon_compile/kernels/scale_add.py), run by
``tests/kernels/test_scale_add_kernel.py`` in a process of its own under Triton's interpreter
(``TRITON_INTERPRET=1`` must be set before Triton is imported).

``python tests/support/scale_add_cases.py kernel``: every case of :data:`CASES` against the exact
update (:func:`check`), exits 1 on the first failure, naming it. ``... step``: a compiled
stacked Muon step, whose write runs the kernel, against the eager step.

The bound. The kernel rounds ``p * scale`` to the parameters' dtype, then adds
``alpha * src`` in fp32 and rounds once (a GPU's fused multiply-add: within half an ulp of
the exact sum). Triton 3.6's interpreter rounds the product ``alpha * src`` to fp32 first
(half an ulp of the product, more than one of the sum where they cancel), so the check allows
one ulp of the parameters' dtype of the largest of the sum, ``p * scale`` and the product
around the exact sum (taken in fp64, whose own rounding is 2^-53 of it).
"""

import sys

import torch

# (members, rows, cols, parameter dtype, src dtype, src layout)
CASES = [
    (1, 1, 1, torch.float32, torch.bfloat16, "contiguous"),
    (3, 37, 70, torch.float32, torch.bfloat16, "contiguous"),
    (3, 37, 70, torch.float32, torch.bfloat16, "transposed"),
    (4, 33, 130, torch.float32, torch.bfloat16, "slice"),
    (2, 130, 3, torch.float32, torch.float16, "transposed"),
    (2, 64, 64, torch.float32, torch.float32, "contiguous"),
    (3, 37, 70, torch.bfloat16, torch.bfloat16, "transposed"),
    (2, 40, 24, torch.float16, torch.float16, "contiguous"),
]


def operands(members, rows, cols, dtype, src_dtype, layout, seed):
    g = torch.Generator().manual_seed(seed)
    dsts = [torch.randn(rows, cols, generator=g).to(dtype) for _ in range(members)]
    if layout == "transposed":
        src = torch.randn(members, cols, rows, generator=g).mT
    elif layout == "slice":  # members 1.. of a bucket of members + 2
        src = torch.randn(members + 2, rows, cols, generator=g)[1:-1]
    else:
        src = torch.randn(members, rows, cols, generator=g)
    return dsts, src.to(src_dtype)


def check(got, before, scale, src, alpha, cautious=False, src_scale=1.0):
    """``got`` is ``before * scale + alpha * src`` to the bound of the module docstring;
    ``cautious``: ``scale`` where ``src * before >= 0`` (in fp32), 1 elsewhere; ``src_scale``:
    ``src`` is ``src * src_scale`` rounded to its dtype (as eager's product is)."""
    dtype = before.dtype
    src = src * src_scale
    if cautious:
        scale = torch.where(src.float() * before.float() >= 0, scale.float(), 1.0)
    decayed = (before * scale).to(dtype).double()  # p * scale rounded to the parameters' dtype, as mul_
    product = torch.tensor(float(alpha), dtype=torch.float32).double() * src.double()
    exact = decayed + product
    largest = torch.maximum(torch.maximum(exact.abs(), decayed.abs()), product.abs())
    ulp = torch.finfo(dtype).eps * largest.clamp_min(torch.finfo(dtype).tiny)
    excess = ((got.double() - exact).abs() - ulp).max().item()
    assert excess <= 0, f"worst excess {excess:.3g} over one ulp"


def kernel_cases():
    from muon_compile.kernels import scale_add as scale_add_kernel

    count = 0
    for i, case in enumerate(CASES):
        for host_scalars in (False, True):
            variants = [(1.0, False, 1.0), (0.999, False, 1.0), (0.9, True, 1.0)]
            if not host_scalars:  # src_scale is a value either way
                variants.append((0.999, False, 1.7320508075688772))
            for scale_value, cautious, src_scale in variants:
                dsts, src = operands(*case, seed=i)
                before = [d.clone() for d in dsts]
                src_before = src.clone()
                scale = torch.tensor(scale_value, dtype=torch.float64)
                alpha = torch.tensor(-0.02 * 1.2247, dtype=torch.float64)
                assert scale_add_kernel.launch(dsts, scale, src, alpha, cautious, host_scalars, src_scale), case
                try:
                    assert torch.equal(src, src_before), "src was written"
                    for got, b, s in zip(dsts, before, src):
                        check(got, b, scale, s, alpha, cautious, src_scale)
                except AssertionError as e:
                    what = f"host scalars {host_scalars}, scale {scale_value}, cautious {cautious}, src_scale {src_scale}"
                    raise AssertionError(f"{case}, {what}: {e}") from None
                count += 1
    dsts, src = operands(*CASES[1], seed=0)
    assert not scale_add_kernel.launch([d.mT.contiguous().mT for d in dsts], torch.ones((), dtype=torch.float64), src, torch.ones(()))
    assert not scale_add_kernel.launch(dsts[:-1], torch.ones((), dtype=torch.float64), src, torch.ones(()))
    table = scale_add_kernel.address_table(dsts)
    assert scale_add_kernel.address_table(dsts) is table and table.tolist() == [d.data_ptr() for d in dsts]
    assert scale_add_kernel.address_table(dsts[::-1]).tolist() == [d.data_ptr() for d in dsts[::-1]]
    # while a CUDA graph is captured (made to say so here): a kept table serves, a new one is
    # not made (no copy to the device then) and the write is left to the op's fallback
    scale_add_kernel.capturing = lambda device: True
    one, half = torch.ones((), dtype=torch.float64), torch.full((), 0.5, dtype=torch.float64)
    assert scale_add_kernel.launch(dsts, one, src, half)
    fresh = [d.clone() for d in dsts]
    # the cases' freed members' memory is reused: a list at their old addresses has a kept table
    kept = {key for key in scale_add_kernel._tables if key != (dsts[0].device, tuple(d.data_ptr() for d in dsts))}
    for key in kept:
        del scale_add_kernel._tables[key]
    assert scale_add_kernel.address_table(fresh) is None and not scale_add_kernel.launch(fresh, one, src, half)
    assert all(torch.equal(f, d) for f, d in zip(fresh, dsts))
    print(f"ok: {count} cases")


def step_case():
    """Compiled steps whose writes run the kernel (from the bf16 NS result) equal eager: the
    stacked optimizer's, and unmodified torch.optim.Muon's (its writes stacked by the pass)."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from helpers import compare_steps, muon
    from numerics import NS_RTOL

    from muon_compile.kernels import scale_add as scale_add_kernel
    from muon_compile.optim import stacks

    stacks.steps_as_one = lambda device, members: True  # the stacks step as on CUDA, which the interpreter stands in for
    launched = []
    launch = scale_add_kernel.launch
    scale_add_kernel.launch = lambda *args, **kw: launched.append((args[2].dtype, launch(*args, **kw))) or launched[-1][1]
    shapes = [(24, 40)] * 3 + [(40, 24)] * 2
    for cautious in (False, True):
        compare_steps(muon(weight_decay=0.1, cautious_weight_decay=cautious), shapes, rtol=NS_RTOL["cpu"][torch.bfloat16])
    # two stacks, two steps, eager and compiled, twice: the compiled write reads the bf16 result
    assert sorted(launched, key=str) == sorted([(torch.float32, True)] * 8 + [(torch.bfloat16, True)] * 8, key=str), launched
    # unmodified torch.optim.Muon: stack_writes makes its per-parameter writes one per
    # orientation of its one bucket (two a step), which the kernel runs from the bf16 result
    launched.clear()
    compare_steps(lambda ps: torch.optim.Muon(ps, lr=torch.tensor(0.02)), [(24, 40)] * 2 + [(40, 24)] * 2,
                  rtol=NS_RTOL["cpu"][torch.bfloat16], steps=1)
    from muon_compile.compile.compat import DYNAMO_ROUNDS_ALPHA_PRODUCTS  # torch 2.11: left per parameter

    assert launched == ([] if DYNAMO_ROUNDS_ALPHA_PRODUCTS else [(torch.bfloat16, True)] * 2), launched
    print("ok: compiled steps")


if __name__ == "__main__":
    {"kernel": kernel_cases, "step": step_case}[sys.argv[1]]()

"""The stacked step's write (``muon_compile::unstack_scale_add_``, issue 59): its Triton
kernel (muon_compile/kernels/scale_add.py) against the exact update on this CPU through
Triton's interpreter (``tests/support/scale_add_cases.py`` states the bound), a compiled step whose
write runs it, and the op's ``torch._foreach_*`` fallback where Triton does not run."""


import pytest
import torch

from muon_compile.kernels import scale_add as scale_add_kernel
from muon_compile.optim import stacks
from muon_compile.config import pass_names

from helpers import compile_with_dump, muon, run_interpreted, stacks_as_on_cuda
from numerics import NS_RTOL
from script_runs import SUPPORT

needs_triton = pytest.mark.skipif(scale_add_kernel.triton is None, reason="the kernel's tests need Triton (pip install triton)")
CASES = SUPPORT / "scale_add_cases.py"
SHAPES = [(24, 40)] * 3 + [(40, 24)] * 2  # a wide stack and a tall one (its result transposed back)


@needs_triton
def test_kernel_equals_the_exact_update():
    """fp32, bf16 and fp16 parameters; bf16, fp16 and fp32 updates, contiguous, transposed
    and a slice of a bucket, also scaled in its own dtype first; 1x1 to 130x3; scale and
    alpha read on the device or passed as values; cautious weight decay; operands it does not
    take are refused; address tables are kept per list, and none is made while a CUDA graph
    is captured."""
    assert "ok: 56 cases" in run_interpreted(CASES, "kernel")


@pytest.mark.slow
@needs_triton
def test_compiled_step_writes_through_the_kernel():
    """Compiled stacked steps whose write runs the kernel (on the bf16 result), with and
    without cautious weight decay, and unmodified torch.optim.Muon's (its writes stacked by
    ``stack_writes``, as on CUDA), equal eager."""
    assert "ok: compiled steps" in run_interpreted(CASES, "step")


def test_fallback_is_mul_then_add_with_alpha():
    """Where Triton does not run (this CPU without the interpreter) the op is ``mul_`` then
    ``add_`` with ``alpha`` per member, from an update of any float dtype and strides (times
    ``src_scale`` in its dtype); with ``cautious`` the factor is ``scale`` where the update and
    the parameter agree in sign."""
    if scale_add_kernel.triton_usable(torch.device("cpu")):
        pytest.skip("TRITON_INTERPRET is set: the op runs the kernel")
    src = torch.randn(3, 40, 24).to(torch.bfloat16).mT
    for scale_value, cautious, src_scale in ((1.0, False, 1.0), (0.999, False, 1.0), (0.9, True, 1.0), (0.999, False, 1.7)):
        dsts = [torch.randn(24, 40) for _ in range(3)]
        factors = [torch.where(s * d >= 0, scale_value, 1.0) if cautious else scale_value for d, s in zip(dsts, src)]
        want = [(d * f).add_(s * src_scale, alpha=-0.0245) for d, f, s in zip(dsts, factors, src)]
        scale, alpha = torch.tensor(scale_value, dtype=torch.float64), torch.tensor(-0.0245, dtype=torch.float64)
        stacks.unstack_scale_add_(dsts, scale, src, alpha, cautious=cautious, src_scale=src_scale)
        for got, w in zip(dsts, want):
            assert torch.equal(got, w)


def test_write_source_changes_no_value(tmp_path, monkeypatch):
    """With ``write_source`` the compiled write reads the bf16 result (golden
    ``single_device_gpt.written.txt``), without it an fp32 copy of it: the parameters come out
    the same bits either way (the cast up is exact, the arithmetic the op's), and equal eager's.
    The stacks as on CUDA (the write op; here its fallback computing the same): a step
    compiled for this CPU steps its members one by one (:mod:`muon_compile.optim.stacks`)."""
    stacks_as_on_cuda(monkeypatch)
    without = tuple(p for p in pass_names() if p != "write_source")
    graphs, step = compile_with_dump(muon(weight_decay=0.1), SHAPES, tmp_path / "all")
    graphs_without, step_without = compile_with_dump(muon(weight_decay=0.1), SHAPES, tmp_path / "without", passes=without)
    assert "write_source_after" in graphs and "write_source_after" not in graphs_without
    for got, other, eager in zip(step.compiled, step_without.compiled, step.eager):
        assert torch.equal(got, other)
    step.assert_close(NS_RTOL["cpu"][torch.bfloat16])


@pytest.mark.cuda
def test_op_on_cuda_runs_the_kernel():
    """On CUDA the op runs the kernel, with the scalars on the device or on the host, cautious
    or not, to the bound of ``tests/support/scale_add_cases.py``; compiled stacked steps equal eager."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from helpers import compare_steps
    from scale_add_cases import CASES, check, operands

    for i, case in enumerate(CASES):
        for scalars_device, cautious in (("cuda", False), ("cpu", False), ("cuda", True)):
            dsts, src = operands(*case, seed=i)
            before = [d.clone() for d in dsts]
            dsts, src = [d.cuda() for d in dsts], src.cuda()
            scale = torch.tensor(0.999, dtype=torch.float64, device=scalars_device)
            alpha = torch.tensor(-0.0245, dtype=torch.float64, device=scalars_device)
            assert scale_add_kernel.applies(dsts, src)
            stacks.unstack_scale_add_(dsts, scale, src, alpha, cautious=cautious)
            for got, b, s in zip(dsts, before, src):
                check(got.cpu(), b, scale.cpu(), s.cpu(), alpha.cpu(), cautious)
    for cautious in (False, True):
        compare_steps(muon(weight_decay=0.1, cautious_weight_decay=cautious), SHAPES, rtol=NS_RTOL["cuda"][torch.bfloat16], device="cuda")

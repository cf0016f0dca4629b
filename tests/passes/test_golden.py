"""Golden graphs of the single-device pipeline (see golden_graphs/README.md); each
compiled step is also checked against the eager step. CPU only: a golden graph pins the
passes' output, whose text names the device; the compiled step's numerics on CUDA are
checked by the device-parametrised tests of the same shapes and passes."""

import torch

import muon_compile
from muon_compile.compile.compat import CPU_FUSION_DROPS_ROUND_TRIP
from muon_compile.optim import stacks

from golden import assert_golden
from helpers import compile_with_dump, count_ns_calls, make_params, muon, set_grads, stacks_as_on_cuda
from ns_forms import exact_torch_muon
from numerics import NS_RTOL, assert_rewrite_close

# Per layer: qkv (3d x d), attention out (d x d), MLP up (4d x d), MLP down (d x 4d); d=16, 2 layers.
GPT_SHAPES = [(48, 16), (16, 16), (64, 16), (16, 64)] * 2


def test_gpt_single_device(tmp_path, monkeypatch):
    """muon_compile.Muon's step of stacked state. Compiled for this CPU, each member steps on
    its own, on its views of the stacks, and the bucket pass stacks their NS inputs
    (:mod:`muon_compile.optim.stacks`): no op call is left in the graph. Then as on CUDA: each
    stack steps as one, gathered by the stack op and written by the stacked write op, whose
    source ``write_source`` makes the bf16 result itself."""
    graphs, step = compile_with_dump(muon(), GPT_SHAPES, tmp_path / "cpu")
    assert_golden("single_device_gpt.before.txt", graphs["bucket_before"])
    assert_golden("single_device_gpt.bucketed.txt", graphs["bucket_after"])
    assert_golden("single_device_gpt.lowered.txt", graphs["lower_after"])
    assert count_ns_calls(graphs["bucket_before"]) == len(GPT_SHAPES)
    # 48x16 (qkv) and 64x16 (up) in their tall layout on this CPU (ns.cost.choose_orientation), 16x16, 16x64 (down)
    assert count_ns_calls(graphs["bucket_after"]) == 4
    assert "muon_compile.stack(" not in graphs["bucket_before"] and "unstack_scale_add_" not in graphs["lower_after"]
    step.assert_close(NS_RTOL["cpu"][torch.bfloat16])

    stacks_as_on_cuda(monkeypatch)
    graphs, step = compile_with_dump(muon(), GPT_SHAPES, tmp_path / "op")
    assert_golden("single_device_gpt.stacked.txt", graphs["bucket_before"])
    assert count_ns_calls(graphs["bucket_before"]) == 4  # one per stack
    assert_golden("single_device_gpt.written.txt", graphs["write_source_after"])
    writes = [line for line in graphs["write_source_after"].splitlines() if "unstack_scale_add_" in line]
    sources = {line.split("src=")[1].split(",")[0] for line in writes}
    assert len(writes) == 4 and all(f"{s}: bf16[" in graphs["write_source_after"] for s in sources)  # the NS result itself
    step.assert_close(NS_RTOL["cpu"][torch.bfloat16])


def test_gram_buckets(tmp_path):
    """The Gram evaluation (issue 14), asked for by the optimizer: the MLP bucket's lowered
    graph is X X^T, the fp16 iteration on 16x16 Gram matrices, a restart after three
    iterations, and Q X; compiled against eager Gram."""
    graphs, step = compile_with_dump(muon(ns_algorithm="gram"), [(64, 16), (16, 64)], tmp_path)
    assert_golden("single_device_gram.lowered.txt", graphs["lower_after"])
    # X X^T and Q X per run (two runs: 3 + 2 iterations), 4 L - 3 16x16 products per run of L
    assert graphs["lower_after"].count("aten.bmm(") == 2 * 2 + (4 * 3 - 3) + (4 * 2 - 3)
    step.assert_close(NS_RTOL["cpu"][torch.bfloat16])


def test_symmetric_products_when_asked(tmp_path, monkeypatch):
    """``MUON_COMPILE_SYM_PRODUCTS=on`` (issue 62): each textbook iteration forms X X^T and
    ``B = b A + c (A A)`` with ``muon_compile.sym_bmm`` (the op runs ``bmm`` on the CPU; on
    CUDA its Triton kernel), then ``X = a X + B X``: the epilogue form, which a GPU runs
    (``MUON_COMPILE_NS_EPILOGUE=on`` here; this CPU's own is the polynomial form,
    ``single_device_gpt.lowered.txt``), the stack as on CUDA; compiled against eager (``bmm``)."""
    stacks_as_on_cuda(monkeypatch)
    graphs, step = compile_with_dump(muon(), [(16, 48), (16, 48)], tmp_path, sym_products="on", ns_epilogue="on")
    assert_golden("single_device_sym.lowered.txt", graphs["lower_after"])
    assert graphs["lower_after"].count("= muon_compile.sym_bmm(") == 2 * 5
    assert graphs["lower_after"].count("aten.baddbmm(") == 5  # X <- a X + B X only
    step.assert_close(NS_RTOL["cpu"][torch.bfloat16])


def test_padding_merge(tmp_path):
    # 16x40 and the tall 40x16 pad into the 16x48 bucket (14% of its NS FLOPs wasted)
    graphs, step = compile_with_dump(muon(), [(16, 48), (16, 40), (40, 16)], tmp_path, pad_waste=0.2)
    assert_golden("single_device_padded.bucketed.txt", graphs["bucket_after"])
    assert muon_compile.counters["bucket.padded_buckets"] == 1
    step.assert_close(NS_RTOL["cpu"][torch.bfloat16])


def test_torch_optim_muon_single_device(tmp_path, monkeypatch):
    """Unmodified torch.optim.Muon: canonicalize turns each 5-step addmm loop into the op,
    and the step is then bucketed exactly like muon_compile.Muon's.

    Then ``stack_writes``: where the stacked write runs in one pass (CUDA; here made to, the
    op's CPU fallback computing the same), its per-parameter writes become one write per
    bucket and orientation: 4 writes of 8 parameters (the 16x64 bucket holds 64x16 members at
    0 and 2, 16x64 ones at 1 and 3). On this CPU, as it is, the pass leaves the writes to
    Inductor; the parameters come out within 2 ulps of the write's terms either way, and equal eager's (on torch
    2.11, whose Dynamo rounds each scaled update to bf16 again, the write does so too: its
    ``src_scale``)."""

    def make(params):
        return torch.optim.Muon(params, lr=0.02)

    graphs, per_parameter = compile_with_dump(make, GPT_SHAPES, tmp_path / "cpu")
    assert_golden("torch_muon_gpt.canonical.txt", graphs["canonicalize_after"])
    assert_golden("torch_muon_gpt.lowered.txt", graphs["lower_after"])
    assert muon_compile.counters["canonicalize.matched"] == len(GPT_SHAPES)
    assert muon_compile.counters["stack_writes.writes"] == 0
    assert count_ns_calls(graphs["bucket_after"]) == 4  # the same four buckets as muon_compile.Muon
    exact = make_params(GPT_SHAPES)
    set_grads(exact, 0)
    with exact_torch_muon():  # the same code with its Newton–Schulz in fp64
        make(exact).step()
    for i, (s, c, e, x) in enumerate(zip(per_parameter.start, per_parameter.compiled, per_parameter.eager, exact)):
        assert_rewrite_close(c - s, e - s, x.detach() - s, torch.bfloat16, f"param {i} {GPT_SHAPES[i]}")

    monkeypatch.setattr(stacks, "writes_in_one_pass", lambda *args: True)
    graphs, step = compile_with_dump(make, GPT_SHAPES, tmp_path / "stacked")
    assert_golden("torch_muon_gpt.written.txt", graphs["stack_writes_after"])
    assert (muon_compile.counters["stack_writes.writes"], muon_compile.counters["stack_writes.members"]) == (4, 8)
    plan = muon_compile.diagnostics.explain.reports()[-1].plans[-1]  # the explanation names each write and its view
    assert plan.startswith("stacked writes:\n") and "one write of 2 x 64x16 from " in plan
    assert ".mT" not in plan  # the tall buckets' results are written in their own layout: no write reads a transpose
    # Two evaluations of p * s + a * O in fp32 (the write's, Inductor's), each rounded within
    # half an ulp of its terms' size: apart by at most 2 eps (|p| + |a O|), however much the
    # terms cancel. torch 2.11's graph rounds each scaled update to bf16 (the write's src_scale
    # does too), which its fused CPU code skips (compat.CPU_FUSION_DROPS_ROUND_TRIP): a bf16
    # rounding of the update apart there besides
    for got, other, start in zip(step.compiled, per_parameter.compiled, per_parameter.start):
        terms = start.abs() + (other - start).abs()
        bound = 2 * torch.finfo(got.dtype).eps * terms
        if CPU_FUSION_DROPS_ROUND_TRIP:  # |a O| <= |p' - p| + lr wd |p| (torch.optim.Muon's weight decay 0.1)
            bound = bound + torch.finfo(torch.bfloat16).eps * ((other - start).abs() + 0.02 * 0.1 * start.abs())
        assert ((got - other).abs() <= bound).all(), (got - other).abs().max()
    step.assert_close(NS_RTOL["cpu"][torch.bfloat16])

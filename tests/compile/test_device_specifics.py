"""What a compiled step must be on an accelerator, checked on every available device: no
host synchronisation inside the step, the pointwise parts as generated kernels (Triton on
CUDA, C++ on the CPU), and, distributed, collectives issued asynchronously, overlapping
compute, and waited before use in Inductor's generated code. (Pinned host memory for offloaded
state is checked in test_offload.py.)"""

import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import muon_compile

from dist_harness import run_world
from dist_workers import GENERATED_WAIT, generated_code
from helpers import MIXED_SHAPES, make_params, set_grads
from numerics import NS_RTOL, assert_rel_close

# ops that read a tensor's value back to the host (on CUDA a synchronisation); a 0-D CPU
# hyper-parameter read as a kernel scalar is a host read, not a sync, and is allowed
HOST_SYNC = re.compile(r"_local_scalar_dense|\.tolist\(\)")
# an Inductor-generated kernel launch in the wrapper code, per device
KERNEL_LAUNCH = {"cpu": re.compile(r"\bcpp_fused\w*\("), "cuda": re.compile(r"\btriton_\w+\.run\(")}
# a pointwise aten op called from the wrapper instead of fused into a kernel
POINTWISE_FALLBACK = re.compile(r"torch\.ops\.aten\.(mul|add|sub|div|lerp|addcmul|sqrt|copy)_?\.")


def _compiled_step(device, make_opt):
    """``(params, compiled step, eager step on a copy, eager params)``, grads set, first call not yet made."""
    params, eager_params = make_params(MIXED_SHAPES, device=device), make_params(MIXED_SHAPES, device=device)
    set_grads(params, 0)
    set_grads(eager_params, 0)
    opt, eager = make_opt(params), make_opt(eager_params)
    return params, torch.compile(opt.step, backend="muon", fullgraph=True), eager.step, eager_params


OPTIMIZERS = {
    "muon_compile": lambda ps: muon_compile.Muon(ps, lr=0.05, ns_dtype=torch.float32),
    "torch.optim.Muon": lambda ps: torch.optim.Muon(ps[:-1], lr=0.05),  # the last one is 3-D
}


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_compiled_step_never_waits_for_the_device(device, optimizer):
    """fullgraph=True: no data-dependent Python branch (a graph break would raise); no op in
    the generated code that reads a value back to the host; on CUDA a second step runs under
    ``torch.cuda.set_sync_debug_mode("error")``, which raises on any synchronising call."""
    params, step, eager_step, eager_params = _compiled_step(device, OPTIMIZERS[optimizer])
    start = [p.detach().clone() for p in params]
    _, code = run_and_get_code(step)
    eager_step()
    dtype = torch.float32 if optimizer == "muon_compile" else torch.bfloat16
    for i, (s, c, e) in enumerate(zip(start, params, eager_params)):
        if optimizer == "muon_compile" or i < len(params) - 1:
            assert_rel_close(c.detach() - s, e.detach() - s, NS_RTOL[device][dtype], f"param {i}")
    body = "\n".join(c[c.index("def call(") :] for c in code)
    assert not HOST_SYNC.search(body), HOST_SYNC.search(body)
    if device == "cuda":
        set_grads(params, 1)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


def test_pointwise_parts_are_generated_kernels(device):
    """Momentum, normalisation, casts and the update are fused kernels of the device's code
    generator (Triton on CUDA), none an aten pointwise call from the wrapper."""
    params, step, eager_step, eager_params = _compiled_step(device, OPTIMIZERS["muon_compile"])
    start = [p.detach().clone() for p in params]
    _, code = run_and_get_code(step)
    eager_step()
    for i, (s, c, e) in enumerate(zip(start, params, eager_params)):
        assert_rel_close(c.detach() - s, e.detach() - s, NS_RTOL[device][torch.float32], f"param {i}")
    body = "\n".join(c[c.index("def call(") :] for c in code)
    assert KERNEL_LAUNCH[device].search(body), f"no generated {device} kernel launched"
    if device == "cuda":
        assert "@triton.jit" in "\n".join(code)
    assert not POINTWISE_FALLBACK.search(body), POINTWISE_FALLBACK.search(body)


def _wait_lines(body):
    """``[(line index of wait_tensor(buf), buf)]`` of the generated wrapper code."""
    return [
        (i, m.group(1))
        for i, line in enumerate(body)
        if (m := GENERATED_WAIT.search(line))
    ]


@pytest.mark.distributed
@pytest.mark.slow
def test_collectives_are_issued_async_and_overlap_compute():
    """gloo, world 2, several buckets: in Inductor's generated code no collective's result is
    read before its wait, and compute kernels run between collectives' launches and their
    waits. The same code generator orders NCCL collectives on CUDA. A return's wait can
    sit well before the kernel that reads it: its first use in the FX graph is a view,
    which Inductor folds into the update kernel fused at the end of the step
    (docs/design.md, "Overlap in the generated code"). That the launches and waits follow
    the schedule pass's order exactly is checked in test_golden_distributed.py (the count
    of overlapped collectives here passed while Inductor had undone every prefetch)."""
    shapes = [(48, 16), (16, 16), (64, 16), (16, 64)] * 3
    for result in run_world(generated_code, 2, shapes, dict(bucket_mb=0.002)):
        code = result["code"]
        body = [line.strip() for line in code[code.index("def call(self, args)") :].splitlines()]
        # comments and Inductor's metadata checks (assert_size_stride, ...) read no data
        body = [line for line in body if line and not line.startswith(("#", "assert_"))]
        waits = _wait_lines(body)
        assert len(waits) == 18, len(waits)  # an all_to_all pair per 0.002 MB bucket
        overlapped = 0
        for i, buf in waits:
            launch = next(j for j in range(i) if re.search(rf"\b{buf}\b", body[j]))
            assert "_c10d_functional.all_to_all_single" in body[launch], body[launch]
            between = body[launch + 1 : i]
            assert not any(re.search(rf"\b{buf}\b", line) for line in between), (buf, between)
            overlapped += any(KERNEL_LAUNCH["cpu"].search(line) or "extern_kernels." in line for line in between)
        assert overlapped >= len(waits) // 2, f"only {overlapped} of {len(waits)} collectives overlap compute"

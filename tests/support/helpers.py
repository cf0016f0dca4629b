"""Shared builders for tests that compile an optimizer step and compare it with eager."""

import contextlib
import dataclasses
import os

import torch
from torch import nn

import muon_compile
from muon_compile.ns.args import NSArgs
from muon_compile.optim import stacks
from muon_compile.passes.find import NSSite

import script_runs
from numerics import BF16_PARAM_RTOL, assert_rel_close

# GPT-like per-layer shapes at d=8 (qkv, attention out, MLP up, MLP down), two layers,
# plus an odd-shaped matrix and a 3-D stack of matrices.
MIXED_SHAPES = [(24, 8), (8, 8), (32, 8), (8, 32)] * 2 + [(5, 7), (2, 8, 16)]

# the devices a device-parametrised test runs on (the ``device`` fixture of conftest.py)
DEVICES = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


def make_params(shapes, dtype=torch.float32, seed=0, device="cpu"):
    """Parameters with seeded values, drawn on the CPU so every device gets the same ones."""
    g = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(tuple(s), generator=g).to(device=device, dtype=dtype)) for s in shapes]


class GraphCapture:
    """A ``torch.compile`` backend that keeps every graph Dynamo hands it and the graph's example
    inputs, and runs the graph as it is: ``capture = GraphCapture()``, ``torch.compile(fn,
    backend=capture)``, then ``capture.graphs`` (``capture.only``: the one graph)."""

    def __init__(self) -> None:
        self.graphs: list = []
        self.inputs: list[list] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        self.inputs.append(list(example_inputs))
        return gm.forward

    @property
    def only(self):
        (gm,) = self.graphs
        return gm


KELLER = (3.4445, -4.775, 2.0315)  # Keller Jordan's step


def keller_args(compute_dtype=torch.bfloat16, steps=5) -> NSArgs:
    """Keller's step ``steps`` times, in ``compute_dtype``: the plans' usual op arguments."""
    return NSArgs.repeating([KELLER], steps, compute_dtype=compute_dtype)


def ns_site(index, rows, cols, batch=1, dtype=torch.float32, args=None, level=0, skip=None, device="cpu") -> NSSite:
    """An NS site as ``find`` describes one, for plans built without a graph."""
    return NSSite(index, batch, rows, cols, 3 if batch > 1 else 2, dtype, device, args or keller_args(), level, skip)


def bucket_count(shapes, device, dtype=torch.bfloat16) -> int:
    """How many buckets ``bucket`` makes of matrices of ``shapes`` (2-D, or 3-D batches; one
    level, no padding, one argument set) on ``device`` with the textbook iteration in ``dtype``:
    one per shape, a tall one sharing its transpose's unless its iterates keep the tall layout
    there (``ns.cost.choose_orientation``'s measured table: this CPU in bf16)."""
    from muon_compile.ns.cost import NATIVE, choose_orientation

    kinds = set()
    for shape in shapes:
        rows, cols = shape[-2:]
        kept = choose_orientation(rows, cols, dtype, torch.device(device).type).kind == NATIVE
        kinds.add((rows, cols) if kept else (min(rows, cols), max(rows, cols)))
    return len(kinds)


def dynamo_frames() -> int:
    """Frames Dynamo has compiled in this process so far (each graph a compile made)."""
    from torch._dynamo.utils import counters

    return counters["frames"]["ok"]


def set_grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(tuple(p.shape), generator=g).to(device=p.device, dtype=p.dtype)


def compare_steps(make_opt, shapes, *, rtol, steps=2, dtype=torch.float32, backend="muon", device="cpu", **compile_kw):
    """Run ``steps`` optimizer steps eager and compiled from the same start on ``device``;
    check every update against eager within ``rtol``. Returns the compiled optimizer's params."""
    eager_params, comp_params = make_params(shapes, dtype, device=device), make_params(shapes, dtype, device=device)
    eager, comp = make_opt(eager_params), make_opt(comp_params)
    compiled_step = torch.compile(comp.step, backend=backend, **compile_kw)
    for step in range(steps):
        set_grads(eager_params, 100 + step)
        set_grads(comp_params, 100 + step)
        before = [p.detach().clone() for p in eager_params]
        eager.step()
        compiled_step()
        for i, (e, c, b) in enumerate(zip(eager_params, comp_params, before)):
            what = f"step {step} param {i} {tuple(e.shape)}"
            if dtype == torch.bfloat16:
                atol = rtol * (e.detach().float() - b.float()).abs().max().item()
                torch.testing.assert_close(c.detach(), e.detach(), rtol=BF16_PARAM_RTOL, atol=atol, msg=what)
            else:
                assert_rel_close(c.detach() - b, e.detach() - b, rtol, what)
        # continue both from the eager state so errors do not compound across steps
        sync_to_eager(eager_params, comp_params, eager, comp)
    return comp_params


def step_and_compare(eager_params, params, eager, opt, step, seed, rtol, what):
    """One eager and one compiled ``step`` from equal gradients (``seed``), each update against
    eager's within ``rtol``; then ``opt`` set to eager's state (:func:`sync_to_eager`)."""
    set_grads(eager_params, seed)
    set_grads(params, seed)
    before = [p.detach().clone() for p in eager_params]
    eager.step()
    step()
    for i, (e, c, b) in enumerate(zip(eager_params, params, before)):
        assert_rel_close(c.detach().float() - b, e.detach().float() - b, rtol, f"{what}, param {i}")
    sync_to_eager(eager_params, params, eager, opt)


def sync_to_eager(eager_params, params, eager, opt):
    """Set ``opt``'s parameters and state to ``eager``'s, in place (their tensors, and any
    captured addresses, stay), so that differences do not compound across compared steps."""
    with torch.no_grad():
        for e, c in zip(eager_params, params):
            c.copy_(e)
            for key, value in eager.state[e].items():
                opt.state[c][key].copy_(value)


@contextlib.contextmanager
def graph_caches_off():
    """Inductor's FX graph cache and the AOTAutograd cache off: every compile runs the
    passes, so their counters and dumps are exact (compiled C++ kernels are still reused)."""
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        yield


def muon(**kw):
    return lambda params: muon_compile.Muon(params, **kw)


def stacks_as_on_cuda(monkeypatch):
    """Compile muon_compile.Muon's stacks on this CPU as on CUDA (:mod:`muon_compile.optim.stacks`):
    each steps as one, and its write is the stacked write op, one pass there (here its CPU
    fallback, which computes the same)."""
    monkeypatch.setattr(stacks, "steps_as_one", lambda device, members: True)
    monkeypatch.setattr(stacks, "writes_in_one_pass", lambda *args: True)


def dumped_graphs(dump_dir):
    """``{"bucket_before": text, ...}`` from the last graph a pipeline run dumped ({} if none)."""
    from pathlib import Path

    graph_dirs = sorted((d for d in Path(dump_dir).iterdir() if d.is_dir()), key=lambda d: int(d.name.rsplit("_", 1)[1]))
    if not graph_dirs:
        return {}
    return {f.stem.split("_", 1)[1]: f.read_text() for f in sorted(graph_dirs[-1].glob("*.txt"))}


@dataclasses.dataclass
class OneStep:
    """One optimizer step from the same start, compiled and eager: the parameters after it."""

    start: list
    compiled: list
    eager: list

    def assert_close(self, rtol):
        """Each compiled update within ``rtol`` (relative Frobenius error) of the eager one."""
        for i, (s, c, e) in enumerate(zip(self.start, self.compiled, self.eager)):
            assert_rel_close(c - s, e - s, rtol, f"param {i} {tuple(s.shape)}")


def compile_with_dump(make_opt, shapes, tmp_path, dtype=torch.float32, device="cpu", **config_changes):
    """One step of ``make_opt(params)`` on ``device`` compiled with the graph caches off and
    the dump directory set, and the same step eager; return the dumped graph texts and the
    :class:`OneStep` (each test checks its numerics with its own tolerance)."""
    from muon_compile import config

    params, eager_params = make_params(shapes, dtype, device=device), make_params(shapes, dtype, device=device)
    start = [p.detach().clone() for p in params]
    opt = make_opt(params)
    set_grads(params, 0)
    set_grads(eager_params, 0)
    with graph_caches_off(), config.override(dump_dir=str(tmp_path), **config_changes):
        torch.compile(opt.step, backend="muon")()
    make_opt(eager_params).step()
    step = OneStep(start, [p.detach() for p in params], [p.detach() for p in eager_params])
    return dumped_graphs(tmp_path), step


def count_ns_calls(graph_text):
    return graph_text.count("= muon_compile.newton_schulz(")


def lowered_products(graph_text):
    """The batched products (``bmm``, ``baddbmm``) in a dumped graph's text."""
    return graph_text.count("aten.bmm(") + graph_text.count("aten.baddbmm(")


# Under Triton's interpreter ``tl.dot`` is numpy's matmul, whose OpenBLAS picks its kernels by
# the CPU or by OPENBLAS_CORETYPE (some machines of this project's kind set it, and
# OPENBLAS_L2_SIZE): each as the machine chooses (the variables removed), and Haswell's, which
# rounds a tile's C[i, j] and C[j, i] apart (issue 74). A kernel's claim holds under both.
BLAS_KERNELS = {
    "blas-detected": {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None},
    "blas-haswell": {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"},
}


def run_interpreted(script, *args, timeout=600, env=None):
    """Run ``python script *args`` with ``TRITON_INTERPRET=1`` (which must be set before
    Triton is imported: another test's import of Inductor may already have done it in a test
    process) and return its stdout; a non-zero exit fails the test with its output. ``env``:
    variables to set in the script's environment (``None`` removes one)."""
    env = {**os.environ, **(env or {}), "TRITON_INTERPRET": "1"}
    env = {name: value for name, value in env.items() if value is not None}
    return script_runs.python(str(script), *args, timeout=timeout, env=env).stdout

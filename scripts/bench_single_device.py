"""Single-device benchmark of one Muon optimizer step: eager, Inductor and the ``muon`` backend.

What is measured
----------------
For each workload (a fixed list of fp32 matrices with fixed random gradients) and each
arm below, one optimizer step is timed on the ``--device`` (``cuda`` when CUDA is
available, else ``cpu``); the table reports the median and the minimum of ``--reps``
timed steps taken after ``--warmup`` untimed ones. Gradients stay the same between steps.
Every arm builds fresh parameters (same seed) and a fresh optimizer. Parameters and
gradients are drawn on the CPU from one seeded generator and then moved to the device,
so every device starts from the same values; everything else an arm creates (state,
stacks, buffers, scalar tensors) is made on the device.

How a step is timed depends on the device:

* ``cpu``: ``time.perf_counter`` around the step call (the CPU runs the step to its end
  before the call returns);
* ``cuda``: a pair of CUDA events (``torch.cuda.Event(enable_timing=True)``) recorded on
  the current stream right before and right after the step call, then
  ``end.synchronize()`` and ``start.elapsed_time(end)``: the GPU time from the start of
  the step's work to its end, including gaps where the GPU waits for the host to launch
  kernels. The warm-up steps are followed by ``torch.cuda.synchronize()``, so no timed
  step overlaps earlier work.

Workloads (``--workload``), models of the registry :mod:`muon_compile.models` (its docstring
says what each is):

    gpt-small       6 layers of a d=384 GPT: fused QKV, attention out, MLP up and down
    many-small      96 small matrices of 8 shapes (64 to 384 rows or columns)
    dense-1b        16 layers of a dense 1B decoder: q, k, v, o 2048x2048; gate, up 5632x2048;
                    down 2048x5632 (large: about 43 NS TFLOP per step)
    dense-1b-2l     the same shapes, 2 layers (a CPU step of all 16 takes about a minute)
    llama-8b-4l     4 layers of Llama 3.1 8B: q, o 4096x4096; k, v 1024x4096; gate, up
                    14336x4096; down 4096x14336 (large: 83 NS TFLOP per step, textbook)
    tiny            4 small matrices: seconds per arm on a CPU, for checking the script

A large workload takes hours on a CPU: ``--workload all`` runs it only on CUDA and says
it skipped it on the CPU; naming it (``--workload dense-1b``) runs it on either device.

Arms (``--arms`` takes the keys, or the long names, comma-separated):

    eager-torch     eager torch.optim.Muon       torch.optim.Muon(lr=0.02, weight_decay=0)
    eager-ours      eager muon_compile.Muon      muon_compile.Muon(lr=0.02)
    inductor-torch  inductor torch.optim.Muon    torch.compile(opt.step)
    inductor-ours   inductor muon_compile.Muon   torch.compile(opt.step)
    muon            muon muon_compile.Muon       torch.compile(opt.step, backend="muon"),
                    (auto)                       Newton–Schulz algorithm chosen per bucket
    muon-cudagraph  ... (auto), CUDA graph       the same, options={"triton.cudagraphs": True}:
                                                 replayed as a CUDA graph (a CPU step warns
                                                 and runs without one)
    muon-textbook   ... (textbook)               the same with ns_algorithm="textbook"
    muon-gram       ... (gram)                   the same with ns_algorithm="gram"
    muon-sym        ... (auto), symmetric        the muon arm with MUON_COMPILE_SYM_PRODUCTS=on:
                    products                     X Xᵀ and squares by muon_compile.kernels.sym
    muon-transposed ... (auto), tall matrices    the muon arm with MUON_COMPILE_NS_ORIENTATION=off:
                    transposed                   a tall matrix's iterates wide, as on CUDA
    muon-torch      muon torch.optim.Muon        torch.compile(opt.step, backend="muon"):
                                                 unmodified, its loops canonicalised
    muon-torch-transposed                        the same with MUON_COMPILE_NS_ORIENTATION=off
    muon-offload    muon ..., offload_state      the muon arm with the state in host memory
                                                 between steps (copied in and out each step)
    hand-stacked    hand-stacked (nanochat)      same-shape params stacked by hand, one
                                                 torch.compile'd momentum+NS+update per shape
    roofline        roofline                     bare bf16 bmm's of the same NS FLOPs
    roofline-gram   roofline (gram products)     bare bmm's of the Gram algorithm's products,
                                                 in the dtype it iterates in (fp16 for bf16)
    roofline-auto   roofline (products chosen)   per shape, the bare products of the algorithm
                                                 the cost model picks there (the muon arm's)
    emerging        Emerging-Optimizers Muon     NVIDIA's (Megatron's) Muon, eager
    heavyball       HeavyBall Muon               HeavyBall's Muon, its helpers compiled
    dion            Dion Muon (one device)       Dion's Muon without a mesh, its parts compiled

The peers (installed from vendor/wheels by scripts/gpu_check.sh; an arm without its package
fails saying so) are configured as close to the optimizers above as their APIs allow; each
function's docstring says where they differ.

Both optimizers run their defaults otherwise: Keller Jordan's coefficients, 5 Newton–Schulz
iterations in bf16, Nesterov momentum 0.95.

After each table: the optimizer state that stays on the parameters' device between
steps, without and with ``offload_state`` (the memory offload saves there). On ``cuda``
``offload_state`` keeps the state in (pinned) host memory, so the saving is the whole
momentum; on ``cpu`` it is zero, as parameters and state share the host memory.

``hand-stacked`` is the by-hand design of nanochat's ``MuonAdamW``: parameters of one
shape (no sharing between a shape and its transpose) are ``torch.stack``-ed each step,
one ``torch.compile(fullgraph=True)`` function does Nesterov momentum, Newton–Schulz on
the stack and the update, and ``torch._foreach_copy_`` writes the rows back.

``roofline`` is the floor that bucketing aims at: all matrices of one canonical shape
(``m x n`` with ``m <= n``; a tall matrix counts as its transpose) in one batch, and per
Newton–Schulz iteration the three products (``X X^T``, ``A A``, ``B X``: ``m x n x m``,
``m x m x m``, ``m x m x n``) as ``torch.bmm(..., out=...)`` of preallocated bf16 operands
into preallocated outputs. That is ``4 m^2 n + 2 m^3`` FLOPs per matrix and iteration
(:func:`muon_compile.ns.cost.ns_flops`), the same matmul work as the optimizers' step,
without their elementwise work, normalisation or casts. ``roofline-gram`` and
``roofline-auto`` do the same with the products of :func:`muon_compile.ns.cost.products`.

Each table's header also gives the NS FLOPs of one step by algorithm
(:func:`muon_compile.ns.cost.ns_flops`): all textbook, all Gram, and ``auto``, what the cost
model picks per shape on the device (:func:`muon_compile.ns.cost.choose`).

Compile time (compiled arms only), all inside one ``torch._inductor.utils.fresh_cache()``
(an empty Inductor cache directory) per arm:

* cold: ``torch._dynamo.reset()``, compile, time the first call;
* warm: ``torch._dynamo.reset()``, compile again, time the first call (the FX graph cache hits).

With ``--compile-workers N`` every compiled arm of every workload first compiles cold in a
process of its own, N at a time, all in one fresh Inductor cache; each arm then compiles warm
and is timed in this process, one arm at a time (a GPU host compiles its arms in parallel on
its cores; a cold compile beside others shares the cores, so it can read high). With
``--kept-cache`` as well, they compile in Inductor's cache directory as it is
(``TORCHINDUCTOR_CACHE_DIR``, or Inductor's default) instead of a fresh one: what an earlier run
compiled is reused, so the "cold" seconds are not cold (the steps are checked, not the figures:
``scripts/gpu_check.sh --device cpu``, whose test would otherwise build every C++ kernel again).

With ``--in-turn``, after a workload's arms are measured one after another as above, every arm
is built and compiled again (one fresh cache, all compiled steps kept live), and its steps are
timed in rounds, one step of each arm per round (``bench_common.time_in_turn``); the table's
step times are those. Timed one after another, an arm finds the machine and the allocator as
the arm before left them: on the CPU glibc returns a large freed block to the system and maps
the next one again, and arms that allocate alike differ by those page faults (docs/benchmarks.md).

A first call is timed by the wall clock (``time.perf_counter``), on ``cuda`` up to a
``torch.cuda.synchronize()`` after the call. The steps are then timed on the
warm-compiled step. Matmul kernel calls per step are counted by profiling one more step
with ``torch.profiler`` (host-side events, also on ``cuda``, synchronised before the
profile ends) and counting the events named ``aten::mm``, ``aten::bmm``, ``aten::addmm``
and ``aten::baddbmm`` (not ``aten::matmul``, which dispatches to those).

Launches per step (compiled arms): the calls of the cold compile's generated code
(:func:`muon_compile.diagnostics.launches.count_launches`), printed ``products+kernels+ops``: matrix
products (extern BLAS calls, Triton matmul templates), the other kernels Inductor generated
(C++ or Triton), and calls into other ops (the stack ops, collectives, aten fallbacks).
GPU kernels per step (every arm, on ``cuda``): the CUDA events (kernels, copies, fills) the
profiled step ran. Below each table, that step's time by kind of kernel
(``bench_common.kernel_kind``: products, Inductor's generated kernels, writes into many
tensors (``_foreach_*``, the stacks' write kernel or op), copies and casts, collectives, the
rest), "busy" their sum and, on ``cuda``, "idle" the median step less it (where the GPU
waited for the host), on the CPU "rest" (its outermost calls of those kinds are counted,
Inductor's C++ kernels named by ``cpp.enable_kernel_profile``; the rest is Python,
dispatch and other aten calls), then the muon arm's costliest kernels besides the
products: where a step's time goes. ``--trace-dir DIR`` also
writes the muon arm's profiled step of each workload to ``DIR/<workload>-muon.json``, a Chrome
trace (``chrome://tracing``, Perfetto): every kernel of that step, to read after the run.

An arm that raises is reported with its error and the run goes on. The clocks, the
compiles and the matmul count are those of ``scripts/bench_common.py``.

Usage::

    python scripts/bench_single_device.py                      # all workloads and arms
    python scripts/bench_single_device.py --workload many-small --reps 3 --warmup 1 \\
        --arms eager-ours,muon,roofline --json /tmp/bench.json
    python scripts/bench_single_device.py --device cuda --workload dense-1b
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import sys
from collections import Counter
from collections.abc import Iterable, Sequence

import torch
from torch._inductor.runtime.cache_dir_utils import cache_dir
from torch._inductor.utils import fresh_cache

import muon_compile
from muon_compile import models
from muon_compile.diagnostics.launches import Launches
from muon_compile.ns.cost import choose, ns_flops, products

from bench_common import (
    KERNEL_KINDS,
    OTHER_KIND,
    Arm,
    ArmResult,
    Step,
    cell,
    compile_in_parallel,
    machine_info,
    machine_line,
    measure,
    non_negative_int,
    positive_int,
    python_312_typing,
    steps_in_turn,
)

LR = 0.02
NS_STEPS = 5  # the default of both optimizers
NS_DTYPE = torch.bfloat16  # the default of both optimizers
SEED = 0

Shape = models.Shape


# ----------------------------------------------------------------------------- workloads
@dataclasses.dataclass(frozen=True)
class Workload:
    """A named list of matrix shapes, each one fp32 parameter with a random gradient.

    ``large``: too big for a CPU (hours per arm); ``--workload all`` runs it only off the CPU.
    """

    name: str
    shapes: tuple[Shape, ...]
    large: bool = False

    @property
    def flops(self) -> int:
        """Newton–Schulz matmul FLOPs of one optimizer step over all matrices (textbook iteration)."""
        return sum(ns_flops(rows, cols, NS_STEPS) for rows, cols in self.shapes)

    def flops_of(self, algorithm: str, device: torch.device) -> int:
        """The NS FLOPs of one step with every matrix on ``algorithm`` (``auto``: what the
        cost model picks for each shape on ``device``)."""
        total = 0
        for rows, cols in self.shapes:
            chosen = algorithm
            if algorithm == "auto":
                chosen = choose(rows, cols, NS_STEPS, NS_DTYPE, device.type, policy="auto").algorithm
            total += ns_flops(rows, cols, NS_STEPS, chosen)
        return total


# every workload one model of the registry, named as there (muon_compile/models.py)
WORKLOADS = {
    m.name: Workload(m.name, m.matrices, m.large)
    for m in map(models.model, ("gpt-small", "many-small", "dense-1b", "dense-1b-2l", "llama-8b-4l", "tiny"))
}


def runs_by_default(workload: Workload, device: torch.device) -> bool:
    """Whether ``--workload all`` runs ``workload`` on ``device``: a large one not on the CPU."""
    return not (workload.large and device.type == "cpu")


@functools.lru_cache(maxsize=1)
def _host_values(workload: Workload) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """Each matrix's initial value and gradient, drawn on the CPU from one seeded generator
    (kept for the workload being measured: 8B's draw takes seconds, and every arm makes it)."""
    gen = torch.Generator().manual_seed(SEED)
    return tuple((torch.randn(shape, generator=gen) * 0.02, torch.randn(shape, generator=gen)) for shape in workload.shapes)


def make_params(workload: Workload, device: torch.device) -> list[torch.nn.Parameter]:
    """Fresh fp32 parameters with ``.grad`` set on ``device``, identical for every call and device.

    The values are drawn on the CPU (fixed seed) and then copied, so they do not depend on the device.
    """
    params = []
    for value, grad in _host_values(workload):
        p = torch.nn.Parameter(value.to(device, copy=True))
        p.grad = grad.to(device, copy=True)
        params.append(p)
    return params


# ---------------------------------------------------------------------------------- arms
def torch_muon_step(workload: Workload, device: torch.device) -> Step:
    return torch.optim.Muon(make_params(workload, device), lr=LR, weight_decay=0.0).step


def our_muon_step(workload: Workload, device: torch.device) -> Step:
    return muon_compile.Muon(make_params(workload, device), lr=LR).step


def our_muon_textbook_step(workload: Workload, device: torch.device) -> Step:
    return muon_compile.Muon(make_params(workload, device), lr=LR, ns_algorithm="textbook").step


def our_muon_gram_step(workload: Workload, device: torch.device) -> Step:
    return muon_compile.Muon(make_params(workload, device), lr=LR, ns_algorithm="gram").step


def our_muon_offload_step(workload: Workload, device: torch.device) -> Step:
    return muon_compile.Muon(make_params(workload, device), lr=LR, offload_state=True).step


def state_bytes_on_param_device(offload_state: bool, workload: Workload, device: torch.device) -> int:
    """Bytes of optimizer state that stay on the parameters' device (``device``) between steps."""
    params = make_params(workload, device)
    opt = muon_compile.Muon(params, lr=LR, offload_state=offload_state)
    return sum(v.nbytes for p in params for v in opt.state[p].values() if v.device == p.device)


_KELLER = (3.4445, -4.7750, 2.0315)


@torch.compile(dynamic=False, fullgraph=True)
def _stacked_group_step(grads, params, momentum_buf, momentum, lr):
    """Momentum, Newton–Schulz and update of one stack of same-shape matrices (nanochat's style)."""
    a, b, c = _KELLER
    momentum_buf.lerp_(grads, 1 - momentum)
    update = grads.lerp(momentum_buf, momentum)
    x = update.bfloat16()
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(NS_STEPS):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    if tall:
        x = x.mT
    scale = max(1.0, params.size(-2) / params.size(-1)) ** 0.5
    params.sub_(x.float() * (lr * scale))


def hand_stacked_step(workload: Workload, device: torch.device) -> Step:
    """Group same-shape parameters; per group stack, run one compiled fused step, copy back."""
    params = make_params(workload, device)
    groups: dict[Shape, list[torch.nn.Parameter]] = {}
    for p in params:
        groups.setdefault(tuple(p.shape), []).append(p)
    buffers = {shape: torch.zeros(len(ps), *shape, device=device) for shape, ps in groups.items()}
    momentum, lr = torch.tensor(0.95, device=device), torch.tensor(LR, device=device)

    def step() -> None:
        for shape, ps in groups.items():
            stacked = torch.stack([p.detach() for p in ps])
            _stacked_group_step(torch.stack([p.grad for p in ps]), stacked, buffers[shape], momentum, lr)
            torch._foreach_copy_([p.detach() for p in ps], list(stacked.unbind(0)))

    return step


# ---------------------------------------------------------------------------------- peers
def _peer(module: str):
    """Import a peer's package (on Python 3.11 too: :func:`bench_common.python_312_typing`), or
    say it is not installed and where it comes from."""
    import importlib

    python_312_typing()
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise RuntimeError(
            f"not installed ({module}: {e}); scripts/gpu_check.sh installs the peers from vendor/wheels "
            "(docs/benchmarks.md, 'Peers')"
        ) from e


def emerging_step(workload: Workload, device: torch.device) -> Step:
    """NVIDIA Emerging-Optimizers' Muon (Megatron's): Keller's coefficients ("simple"), 5 steps,
    bf16 products (``fp32_matmul_prec="medium"``), Nesterov, torch's learning-rate scale.
    Not the same: it normalises in fp32 with eps 1e-15; one Newton–Schulz per matrix, eager."""
    orthogonalized = _peer("emerging_optimizers.orthogonalized_optimizers")
    return orthogonalized.Muon(
        make_params(workload, device), lr=LR, momentum=0.95, weight_decay=0.0, nesterov=True,
        fp32_matmul_prec="medium", coefficient_type="simple", num_ns_steps=NS_STEPS, scale_mode="shape_scaling",
    ).step


def heavyball_step(workload: Workload, device: torch.device) -> Step:
    """HeavyBall's Muon, Nesterov on a heavy-ball buffer (torch's direction), 5 bf16 steps, its
    own compiled helpers in Inductor's default mode (its default, max-autotune, would spend the
    run autotuning). Not the same: the five per-iteration coefficient tuples of modded-nanogpt
    (Keller's only for square matrices, by a module-wide switch), stochastic rounding to bf16."""
    heavyball = _peer("heavyball")
    heavyball.utils.compile_mode = "default"
    opt = heavyball.Muon(
        make_params(workload, device), lr=LR, betas=(0.95, 0.99), weight_decay=0.0, nesterov=True,
        heavyball_momentum=True, warmup_steps=0,
    )
    opt.consume_grad = False  # it drops each gradient once used; every arm here steps on the same gradients
    return opt.step


def dion_step(workload: Workload, device: torch.device) -> Step:
    """Dion's Muon on one device (``distributed_mesh=None``): same-shape matrices batched, its
    compiled bf16 Newton–Schulz, Nesterov. Not the same: its five per-iteration coefficient
    tuples (``use_polar_express=False``; Keller's only through a Python hook it would run
    eagerly), ``lr * sqrt(rows / cols)`` (smaller than torch's for wide matrices)."""
    dion = _peer("dion")
    return dion.Muon(
        make_params(workload, device), distributed_mesh=None, lr=LR, mu=0.95, weight_decay=0.0, epsilon=1e-7,
        nesterov=True, adjust_lr="spectral_norm", use_triton=False, use_polar_express=False,
    ).step


def canonical_counts(shapes: Iterable[Shape]) -> Counter[Shape]:
    """How many matrices there are of each canonical (``m <= n``) shape."""
    return Counter((min(r, c), max(r, c)) for r, c in shapes)


def products_roofline(workload: Workload, device: torch.device, algorithm: str) -> Step:
    """Bare batched matmuls of ``algorithm``'s products (:func:`muon_compile.ns.cost.products`:
    shapes, counts and the dtype it iterates in) for every canonical shape of ``workload``,
    each shape's matrices in one batch, into preallocated outputs (see the module doc);
    ``auto``: each shape's products under the algorithm the cost model picks for it on ``device``."""
    gen = torch.Generator().manual_seed(SEED)
    calls, flops = [], 0
    for (m, n), k in canonical_counts(workload.shapes).items():
        chosen = algorithm
        if algorithm == "auto":
            chosen = choose(m, n, NS_STEPS, NS_DTYPE, device.type, policy="auto").algorithm
        for p in products(chosen, m, n, NS_STEPS, NS_DTYPE):
            a = torch.randn(k, p.m, p.k, generator=gen).to(device=device, dtype=p.dtype) / p.k
            b = torch.randn(k, p.k, p.n, generator=gen).to(device=device, dtype=p.dtype)
            calls.append((a, b, torch.empty(k, p.m, p.n, dtype=p.dtype, device=device), p.count))
            flops += k * p.flops
    want = workload.flops_of(algorithm, device)
    assert flops == want, (flops, want)  # transposing keeps the FLOPs

    def step() -> None:
        for a, b, out, count in calls:
            for _ in range(count):
                torch.bmm(a, b, out=out)

    return step


def roofline_step(workload: Workload, device: torch.device) -> Step:
    return products_roofline(workload, device, "textbook")


def gram_roofline_step(workload: Workload, device: torch.device) -> Step:
    return products_roofline(workload, device, "gram")


def auto_roofline_step(workload: Workload, device: torch.device) -> Step:
    return products_roofline(workload, device, "auto")


ARMS = (
    Arm("eager-torch", "eager torch.optim.Muon", torch_muon_step),
    Arm("eager-ours", "eager muon_compile.Muon", our_muon_step),
    # "inductor" is torch.compile's default backend
    Arm("inductor-torch", "inductor torch.optim.Muon", torch_muon_step, "inductor"),
    Arm("inductor-ours", "inductor muon_compile.Muon", our_muon_step, "inductor"),
    Arm("muon", "muon muon_compile.Muon (auto)", our_muon_step, "muon"),
    Arm("muon-cudagraph", "muon muon_compile.Muon (auto), CUDA graph", our_muon_step, "muon", {"triton.cudagraphs": True}),
    Arm("muon-textbook", "muon muon_compile.Muon (textbook)", our_muon_textbook_step, "muon"),
    Arm("muon-gram", "muon muon_compile.Muon (gram)", our_muon_gram_step, "muon"),
    Arm("muon-sym", "muon muon_compile.Muon (auto), symmetric products", our_muon_step, "muon", settings={"sym_products": "on"}),
    Arm("muon-transposed", "muon muon_compile.Muon (auto), tall matrices transposed", our_muon_step, "muon", settings={"ns_orientation": "off"}),
    Arm("muon-torch", "muon torch.optim.Muon", torch_muon_step, "muon"),
    Arm("muon-torch-transposed", "muon torch.optim.Muon, tall matrices transposed", torch_muon_step, "muon", settings={"ns_orientation": "off"}),
    Arm("muon-offload", "muon muon_compile.Muon, offload_state", our_muon_offload_step, "muon"),
    Arm("hand-stacked", "hand-stacked (nanochat)", hand_stacked_step),
    Arm("roofline", "roofline", roofline_step),
    Arm("roofline-gram", "roofline (gram products)", gram_roofline_step),
    Arm("roofline-auto", "roofline (products chosen)", auto_roofline_step),
    Arm("emerging", "Emerging-Optimizers Muon (Megatron)", emerging_step),
    Arm("heavyball", "HeavyBall Muon", heavyball_step),
    Arm("dion", "Dion Muon (one device)", dion_step),
)
MUON_ARM = "muon"
ROOFLINE_ARM = "roofline"


# ---------------------------------------------------------------------------- reporting
def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y is not None and y > 0 else None


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def table_row(result: ArmResult, roofline_s: float | None, muon_s: float | None) -> list[str]:
    """One table row; a comparison of an arm with itself does not apply and prints '-'."""
    median = result.median_s
    vs_roofline = None if result.key == ROOFLINE_ARM else _ratio(median, roofline_s)
    muon_speedup = None if result.key == MUON_ARM else _ratio(median, muon_s)
    return [
        result.name + (" (FAILED)" if result.error else ""),
        cell(_scaled(median, 1e3), ".2f"),
        cell(_scaled(result.min_s, 1e3), ".2f"),
        cell(vs_roofline, ".2f", "x"),
        cell(None if vs_roofline is None else 100 / vs_roofline, ".1f", "%"),
        cell(muon_speedup, ".2f", "x"),
        cell(result.cold_compile_s, ".1f"),
        cell(result.warm_compile_s, ".1f"),
        cell(result.matmul_calls, "d"),
        "-" if result.launches is None else _launch_cell(result.launches),
        cell(result.gpu_kernels, "d"),
    ]


def _launch_cell(launches: Launches) -> str:
    return f"{launches.products}+{launches.kernels}+{launches.ops}"


HEADER = ["arm", "step ms (median)", "min ms", "vs roofline", "% of roofline",
          "muon speedup", "cold compile s", "warm compile s", "matmul calls/step",
          "launches/step (products+kernels+ops)", "GPU kernels/step"]


def format_table(rows: list[list[str]], header: list[str] = HEADER) -> str:
    """Columns padded to width: the first left-aligned, the rest right-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows)])


def kernel_time_lines(results: list[ArmResult], device_type: str) -> list[str]:
    """The time of each profiled arm's step by kind of kernel, and the muon arm's costliest
    kernels besides the products: on CUDA the GPU's time (idle: the median step less the busy
    time), on the CPU the outermost calls of a known kind (rest: Python, dispatch, other aten
    calls)."""
    profiled = [r for r in results if r.kernel_ms is not None]
    if not profiled:
        return []
    gpu = device_type == "cuda"
    kinds = KERNEL_KINDS if gpu else tuple(k for k in KERNEL_KINDS if k != OTHER_KIND)
    header = ["arm", *kinds, "busy", "idle" if gpu else "rest"]
    rows = []
    for r in profiled:
        busy = sum(r.kernel_ms[k] for k in kinds)
        rest = None if r.median_s is None else r.median_s * 1e3 - busy
        rows.append([r.name, *(cell(r.kernel_ms[k], ".2f") for k in kinds), cell(busy, ".2f"), cell(rest, ".2f")])
    title = (
        "GPU ms of one profiled step by kind of kernel (idle: the median step less the busy time):"
        if gpu
        else "CPU ms of one profiled step by kind of call (rest: the median step less those: Python, dispatch, other aten calls):"
    )
    lines = [title, format_table(rows, header)]
    muon = next((r for r in profiled if r.key == MUON_ARM), None)
    if muon is not None and muon.top_kernels:
        lines.append(f"{muon.name}: its costliest kernels besides the products:")
        lines += [f"  {ms:8.3f} ms  {calls:4d} calls  {name[:100]}" for name, ms, calls in muon.top_kernels]
    return lines


def muon_comparisons(results: list[ArmResult]) -> list[str]:
    """'muon vs <arm>: 2.31x faster' for every other arm with a step time."""
    muon = next((r for r in results if r.key == MUON_ARM and r.median_s is not None), None)
    if muon is None:
        return []
    lines = []
    for r in results:
        ratio = _ratio(r.median_s, muon.median_s)
        if r is muon or ratio is None:
            continue
        verdict = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
        lines.append(f"muon vs {r.name}: {verdict}")
    return lines


def report(workload: Workload, results: list[ArmResult], machine: dict, warmup: int, reps: int, in_turn: bool = False) -> str:
    by_key = {r.key: r for r in results}
    roofline_s = by_key[ROOFLINE_ARM].median_s if ROOFLINE_ARM in by_key else None
    muon_s = by_key[MUON_ARM].median_s if MUON_ARM in by_key else None
    lines = [
        f"=== workload {workload.name}: {len(workload.shapes)} fp32 matrices, "
        f"{workload.flops / 1e9:.3f} NS GFLOP/step ({NS_STEPS} iterations, {str(NS_DTYPE).removeprefix('torch.')}) ===",
        f"{machine_line(machine)}; median of {reps} steps after {warmup} warm-up"
        + ("; the arms' steps timed in turn, one each per round (--in-turn)" if in_turn else ""),
    ]
    device = torch.device(machine["device"])
    per_algorithm = {a: workload.flops_of(a, device) for a in ("textbook", "gram", "auto")}
    lines.append(
        "NS GFLOP/step by algorithm: "
        + ", ".join(f"{a} {f / 1e9:.3f} ({f / per_algorithm['textbook']:.2f}x)" for a, f in per_algorithm.items())
        + f" (auto: the cost model's choice per shape on {device.type})"
    )
    if roofline_s:
        lines.append(f"roofline: {workload.flops / roofline_s / 1e9:.1f} GFLOP/s")
    lines += ["", format_table([table_row(r, roofline_s, muon_s) for r in results]), ""]
    if kernels := kernel_time_lines(results, device.type):
        lines += [*kernels, ""]
    lines += muon_comparisons(results)
    lines += [f"{r.name} failed: {r.error}" for r in results if r.error]
    return "\n".join(lines)


def to_json(workload: Workload, results: list[ArmResult]) -> dict:
    return {
        "workload": workload.name,
        "matrices": len(workload.shapes),
        "ns_gflop": workload.flops / 1e9,
        "arms": [{**dataclasses.asdict(r), "median_s": r.median_s, "min_s": r.min_s} for r in results],
    }


# ---------------------------------------------------------------------------------- CLI
def _select_arms(text: str | None) -> list[Arm]:
    """The arms named in a comma list (keys or long names), in table order; all when None."""
    if text is None:
        return list(ARMS)
    wanted = {item.strip() for item in text.split(",") if item.strip()}
    known = {a.key for a in ARMS} | {a.name for a in ARMS}
    unknown = wanted - known
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown arm(s) {sorted(unknown)}; choose from {[a.key for a in ARMS]} or {[a.name for a in ARMS]}"
        )
    return [a for a in ARMS if a.key in wanted or a.name in wanted]


def _select_workloads(text: str) -> str | list[str]:
    """``"all"``, or the workload names of the comma list ``text`` (an unknown one is an error)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return "all"
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)} or all")
    return names


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None,
                        help="where the steps run (default cuda when CUDA is available, else cpu)")
    parser.add_argument("--workload", type=_select_workloads, default="all",
                        help=f"comma list of {','.join(WORKLOADS)}, or all (default), which runs the large workloads "
                        f"({', '.join(w.name for w in WORKLOADS.values() if w.large)}) only off the CPU")
    parser.add_argument("--reps", type=positive_int, default=7, help="timed steps after warm-up (default 7)")
    parser.add_argument("--warmup", type=non_negative_int, default=2, help="untimed steps first (default 2)")
    parser.add_argument("--arms", type=_select_arms, default=None,
                        help=f"comma list of arm keys or names (default all): {','.join(a.key for a in ARMS)}")
    parser.add_argument("--in-turn", action="store_true",
                        help="time the steps again with every arm compiled and live, one step of each per round, "
                        "and report those times: what the machine's drift and the allocator's state do falls on "
                        "every arm alike (compiles and profiles are still each arm's own, measured first)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--trace-dir", metavar="DIR",
                        help="write the muon arm's profiled step of each workload there as a Chrome trace")
    parser.add_argument("--compile-workers", type=non_negative_int, default=0, metavar="N",
                        help="first compile every compiled arm cold, N at a time, each in a process of its own, in one "
                        "fresh Inductor cache; then time the arms one at a time (default 0: each arm compiles in "
                        "turn, in this process, in a fresh cache of its own)")
    parser.add_argument("--kept-cache", action="store_true",
                        help="with --compile-workers: compile in Inductor's cache directory as it is "
                        "(TORCHINDUCTOR_CACHE_DIR or Inductor's default), not a fresh one; compile times are then "
                        "not cold (for checking that every step runs)")
    args = parser.parse_args(argv)
    if args.kept_cache and not args.compile_workers:
        parser.error("--kept-cache needs --compile-workers N (N >= 1): it names the cache the compile processes share")
    args.arms = args.arms or list(ARMS)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    elif args.device == "cuda" and not torch.cuda.is_available():
        parser.error(
            f"--device cuda: CUDA is not available (torch.cuda.is_available() is False; "
            f"torch {torch.__version__}, built with CUDA {torch.version.cuda})"
        )
    args.device = torch.device(args.device)
    return args


def arm_and_workload(workload: str, arm: str) -> tuple[Arm, Workload]:
    """The arm and the workload of these names (what a compile process builds)."""
    return next(a for a in ARMS if a.key == arm), WORKLOADS[workload]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.kept_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir()  # the compile processes find it there
        print(f"compiling in the kept Inductor cache {cache_dir()}: compile seconds are not cold\n", flush=True)
    with fresh_cache() if args.compile_workers and not args.kept_cache else contextlib.nullcontext():
        run(args)


def run(args: argparse.Namespace) -> None:
    device = args.device
    workloads = list(WORKLOADS.values()) if args.workload == "all" else [WORKLOADS[n] for n in args.workload]
    machine = machine_info(device)
    output = {"device": device.type, "machine": machine, "warmup": args.warmup, "reps": args.reps,
              "compile_workers": args.compile_workers, "kept_cache": args.kept_cache,
              "workloads": [], "skipped_workloads": []}
    skipped = [w for w in workloads if args.workload == "all" and not runs_by_default(w, device)]
    compiled = {}
    if args.compile_workers:
        jobs = {
            (w.name, a.key): functools.partial(arm_and_workload, w.name, a.key)
            for w in workloads if w not in skipped for a in args.arms if a.backend is not None
        }
        print(f"compiling {len(jobs)} arms cold, {args.compile_workers} at a time ...", file=sys.stderr, flush=True)
        compiled = compile_in_parallel(jobs, device, args.compile_workers)
    for workload in workloads:
        if workload in skipped:
            print(f"=== workload {workload.name}: skipped on {device.type} (too large; "
                  f"--workload {workload.name} runs it anyway) ===\n", flush=True)
            output["skipped_workloads"].append(workload.name)
            continue
        results = []
        for arm in args.arms:
            print(f"[{workload.name}] {arm.name} ...", file=sys.stderr, flush=True)
            trace = None
            if args.trace_dir and arm.key == MUON_ARM:
                os.makedirs(args.trace_dir, exist_ok=True)
                trace = os.path.join(args.trace_dir, f"{workload.name}-{arm.key}.json")
            results.append(measure(arm, workload, device, args.warmup, args.reps, compiled.get((workload.name, arm.key)), trace))
        if args.in_turn:
            print(f"[{workload.name}] every arm again, its steps timed in turn ...", file=sys.stderr, flush=True)
            in_turn = steps_in_turn(args.arms, workload, device, args.warmup, args.reps)
            for result in results:
                if result.error is None:
                    result.times_s = in_turn.get(result.key)
        print(report(workload, results, machine, args.warmup, args.reps, args.in_turn), flush=True)
        kept = [state_bytes_on_param_device(o, workload, device) / 2**20 for o in (False, True)]
        print(
            f"optimizer state on the parameters' device between steps: {kept[0]:.1f} MiB, "
            f"{kept[1]:.1f} MiB with offload_state=True (saved {kept[0] - kept[1]:.1f} MiB)\n",
            flush=True,
        )
        output["workloads"].append(to_json(workload, results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(output, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""The ``muon`` torch.compile backend: Inductor with the muon_compile passes installed.

Registered through the ``torch_dynamo_backends`` entry point, so
``torch.compile(opt.step, backend="muon")`` works without importing this package first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
import torch._functorch.config
from torch._inductor.compile_fx import compile_fx

from .. import config
from ..diagnostics import explain
from ..diagnostics.counters import timed
from ..distributed import rank_agreement
from ..distributed.rank_agreement.fingerprint import fingerprint
from ..passes import MuonGraphPass, new_dump_name, run_torch_passes
from . import compat, cpu_heap, cuda_graphs, tensorify
from .cache_key import rank_key

compat.tolerate_unread_users()
compat.lazy_fallback_log()

# Inductor's fusion search tries each node against the next N nodes that read the same
# buffer. Every per-parameter kernel of an optimizer step reads the same 0-D
# hyper-parameter tensors, so the default window (64) makes that search quadratic-ish:
# on 96 matrices it took 26 of 54 s of cold compile. A window of 8 compiled in 34 s with
# the same step time (scripts/bench_single_device.py); ``options`` may override it.
#
# emulate_precision_casts keeps a bf16 round trip (``x.bfloat16().float()``) rounding inside
# fused kernels, as eager does; without it a matrix whose cast to the compute dtype fuses
# into its normalisation skips that rounding, and compiled and eager Newton–Schulz differ
# by up to 10% on ill-conditioned matrices instead of agreeing bit for bit.
_INDUCTOR_DEFAULTS = {"max_fusion_buffer_group_pairwise_attempts": 8, "emulate_precision_casts": True}

# A graph with collectives keeps the order the ``schedule`` pass gave it. Inductor's
# peak-memory reordering (on by default) issues each collective as late as it can, right
# before its wait: in the all_gather step at prefetch 1 it undid every prefetch (each
# gather waited at once, the next issued only after the bucket's Newton-Schulz), and in
# the all_to_all step every forward one (docs/design.md, "Overlap in the generated code").
# The memory the prefetched buckets hold is the schedule's to budget (the advisor estimates
# it: muon_compile.advisor.step_cost.buffer_bytes).
_SCHEDULED_DEFAULTS = {"reorder_for_peak_memory": False}


def muon_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Any:
    """Compile ``gm`` with Inductor, running the muon_compile passes: ``canonicalize`` on
    ``gm`` itself (Newton–Schulz loops become the op), the others on its post-grad graph.

    ``mode`` and ``options`` are Inductor's (as in ``torch.compile(mode=..., options=...)``);
    the passes' own settings come from :mod:`muon_compile.config`. A
    ``post_grad_custom_post_pass`` in ``options`` (or, without one there, in
    ``torch._inductor.config``), one pass or a list, runs after this package's passes; the
    FX graph cache stays on only if each such pass is a ``CustomGraphPass`` with a
    ``uuid()``, as with plain Inductor.

    A graph with collectives is compiled only once the ranks of each of its process
    groups agree on it (:mod:`muon_compile.distributed.rank_agreement`; a cache hit included), and
    the compiled step names this package when its collectives fail. Inductor keeps its
    order (the ``schedule`` pass's prefetch): its peak-memory reordering is off for it
    unless ``options`` sets ``reorder_for_peak_memory``. A graph that runs on the CPU makes
    the process's heap keep a step's freed memory for the next (:mod:`muon_compile.compile.cpu_heap`).
    """
    cfg = config.current()
    dump_name = new_dump_name()
    with explain.collecting(cfg.explain, gm):
        if cpu_heap.runs_on_cpu(example_inputs) and (kept := cpu_heap.keep(cfg.cpu_heap_mb)):
            explain.note_plan(f"CPU heap: up to {kept} MiB of freed memory kept for the next step (MUON_COMPILE_CPU_HEAP_MB)")
        run_torch_passes(gm, cfg, dump_name, example_inputs)
        with timed("fingerprint"):
            facts = fingerprint(gm, example_inputs, cfg, _traced_frame_locals())
        if facts is not None:
            try:
                rank_agreement.agree(facts.as_lists(), cfg.agree_timeout, _compile_id())
            except rank_agreement.RankDivergenceError as e:  # raised by the step, as this type, on every call
                return rank_agreement.failing(e)
        patches: dict[str, Any] = dict(_INDUCTOR_DEFAULTS)
        if facts is not None:
            patches.update(_SCHEDULED_DEFAULTS)
        if mode is not None:
            patches.update(torch._inductor.list_mode_options(mode))
        patches.update(options or {})
        lift = cuda_graphs.decide(gm, patches, example_inputs)
        if lift is not None:
            example_inputs = lift.inputs(example_inputs)
        user_passes = patches.pop("post_grad_custom_post_pass", torch._inductor.config.post_grad_custom_post_pass)
        patches["post_grad_custom_post_pass"] = MuonGraphPass(cfg, rank_key(example_inputs), dump_name, user_passes)
        tensorify.mark_unused_items(gm)  # no second Dynamo trace for the float64 hyper-parameters
        tensorify.alpha_as_product(gm)  # a float lr given as alpha= stays an input: no recompile per value
        # a symbolic float lr: no AOTAutograd cache, which served torch 2.13 a stale one (compile/tensorify.py)
        no_aot_cache = torch._functorch.config.patch(enable_autograd_cache=False)
        with no_aot_cache if tensorify.float_inputs(gm) else contextlib.nullcontext():
            compiled = compile_fx(gm, example_inputs, config_patches=patches)
        if lift is not None:
            compiled = lift.wrap(compiled)
    return compiled if facts is None else rank_agreement.guard_collectives(compiled, list(facts.groups))


def _compile_id() -> object:
    """Dynamo's id of the compilation in progress (frame, recompilation), or None."""
    from torch._guards import CompileContext

    return CompileContext.current_compile_id()


def _traced_frame_locals() -> dict | None:
    """The locals of the frame Dynamo is compiling (to name parameters in errors), or None."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        return InstructionTranslator.current_tx().f_locals
    except Exception:  # not inside Dynamo (a direct call), or an internal that moved
        return None

"""The pipeline, top to bottom: canonicalize on the Dynamo graph (before AOTAutograd),
then on the post-grad graph find -> plan -> distribute -> bucket -> schedule -> plan
algorithms -> lower -> stack_writes -> write_source,
then the user's own post-grad passes, if any (:class:`MuonGraphPass`).

Each pass is named; with ``MUON_COMPILE_DUMP_DIR`` set, the graph before and after each
pass is written there in the normalised text of :mod:`graph_text`; after each pass the
graph contract is checked (lint, fake ``meta['val']`` everywhere, no new aliasing
of outputs).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch.fx as fx
from torch._inductor import custom_graph_pass
from torch._inductor.custom_graph_pass import CustomGraphPass

import muon_compile
from muon_compile import config as config_mod
from muon_compile import explain, ns_op, routing, triton_support
from muon_compile.cache_key import sources_hash
from muon_compile.counters import counters, pass_seconds

from .bucket import apply_buckets
from .canonicalize import apply_canonical, plan_canonical, reject_log
from .distribute import apply_distribution
from .find import find_ns_sites
from .graph_text import graph_text
from .graph_utils import alias_pattern, check_contract, ns_call
from .lower import lower_ns_ops
from .near_miss import unseen_loops
from .plan_algorithms import plan_algorithms
from .plan_buckets import plan_buckets
from .plan_distributed import plan_distributed
from .schedule import apply_schedule
from .stack_writes import apply_stack_writes, plan_stack_writes
from .write_source import apply_write_sources, plan_write_sources

log = logging.getLogger(__name__)
_graph_ids = itertools.count()


def new_dump_name() -> str:
    """A directory name for the dumps of one compiled graph (torch-level and post-grad)."""
    return f"graph_{os.getpid()}_{next(_graph_ids)}"


class _Dumper:
    """Writes ``<dump_dir>/<name>/<nn>_<pass>_{before,after}.txt`` when a dump dir is set."""

    def __init__(self, dump_dir: str | None, name: str | None = None) -> None:
        self.dir = None
        if dump_dir:
            self.dir = Path(dump_dir) / (name or new_dump_name())
            self.dir.mkdir(parents=True, exist_ok=True)
        self.seq = itertools.count(len(list(self.dir.glob("*.txt"))) if self.dir else 0)

    def write(self, pass_name: str, stage: str, graph: fx.Graph) -> None:
        if self.dir is not None:
            (self.dir / f"{next(self.seq):02d}_{pass_name}_{stage}.txt").write_text(graph_text(graph))


def _run_pass(
    name: str, graph: fx.Graph, dumper: _Dumper, fn: Callable[[], None], meta_key: str = "val"
) -> None:
    dumper.write(name, "before", graph)
    aliasing = alias_pattern(graph)
    start = time.perf_counter()
    fn()
    check_contract(graph, name, aliasing, meta_key)
    pass_seconds[name] += time.perf_counter() - start
    log.debug("pass %s took %.3f s", name, time.perf_counter() - start)
    dumper.write(name, "after", graph)


@contextlib.contextmanager
def _timed(key: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        pass_seconds[key] += time.perf_counter() - start


def run_torch_passes(
    gm: fx.GraphModule, cfg: config_mod.Config, dump_name: str | None = None, example_inputs: Sequence[Any] = ()
) -> None:
    """Run the torch-level pass (canonicalize) on a Dynamo graph module, in place;
    ``example_inputs`` are the real inputs it is compiled for (one per placeholder).
    Its time, planning included, adds to ``pass_seconds["torch_passes"]``."""
    if cfg.enabled("canonicalize"):
        with _timed("torch_passes"):
            _canonicalize(gm, cfg, dump_name, example_inputs)


def _canonicalize(gm: fx.GraphModule, cfg: config_mod.Config, dump_name: str | None, example_inputs: Sequence[Any]) -> None:
    placeholders = gm.graph.find_nodes(op="placeholder")
    values = dict(zip(placeholders, example_inputs)) if len(placeholders) == len(example_inputs) else {}
    matches, rejected = plan_canonical(gm.graph, values)
    reject_log(rejected)
    for m in matches:
        fixed = "".join(f"; {n.name} = {v.tolist()} compiled in" for n, v in m.chain.fixed)
        explain.note_loop(m.chain.start, True, f"newton_schulz({m.args.describe()}){fixed}")
    for r in rejected:
        explain.note_loop(r.chain.start, False, r.reason)
    for node, reason in unseen_loops(gm.graph, [m.chain for m in matches] + [r.chain for r in rejected]):
        counters["canonicalize.unseen"] += 1
        log.info("Newton–Schulz-like loop at %s left as it was: %s", explain.source_line(node), reason)
        explain.note_loop(node, False, reason)
    if not matches:
        return
    dumper = _Dumper(cfg.dump_dir, dump_name)
    _run_pass("canonicalize", gm.graph, dumper, lambda: apply_canonical(gm.graph, matches), "example_value")
    gm.recompile()
    routed = gm.graph.find_nodes(op="call_function", target=ns_op.newton_schulz_routed)
    routing.prepare_graph_inputs([n.args[0].meta["example_value"] for n in routed])


def run_passes(graph: fx.Graph, cfg: config_mod.Config, dump_name: str | None = None) -> None:
    """Run the enabled post-grad passes of ``cfg`` on ``graph``, in place; their time,
    planning included, adds to ``pass_seconds["post_grad_passes"]``."""
    with _timed("post_grad_passes"):
        _post_grad(graph, cfg, dump_name)


def _post_grad(graph: fx.Graph, cfg: config_mod.Config, dump_name: str | None) -> None:
    nodes, sites = find_ns_sites(graph)
    if not nodes:
        return
    counters["find.ns_ops"] += len(nodes)
    explain.note_plan("\n".join(f"site {i}: {explain.source_line(n)}" for i, n in enumerate(nodes)))
    if symbolic := [n for n, site in zip(nodes, sites) if site.symbolic]:
        explain.warn_symbolic_shapes([str(tuple(ns_call(n).input.meta["val"].shape)) for n in symbolic])
    dumper = _Dumper(cfg.dump_dir, dump_name)
    distributed = False
    if cfg.enabled("distribute"):
        dist_plan = plan_distributed(sites, bucket_mb=cfg.bucket_mb, strategy=cfg.strategy)
        if dist_plan.buckets or dist_plan.skipped:
            log.debug("distribution plan:\n%s", dist_plan.describe())
            explain.note_plan(dist_plan.describe())
            _run_pass("distribute", graph, dumper, lambda: apply_distribution(graph, nodes, dist_plan))
            distributed = bool(dist_plan.buckets)
    if cfg.enabled("bucket"):
        plan = plan_buckets(sites, bucket_mb=cfg.bucket_mb, pad_waste=cfg.pad_waste)
        if plan.buckets or plan.skipped:
            log.debug("bucket plan for %d NS ops:\n%s", len(nodes), plan.describe())
            explain.note_plan(plan.describe())
            _run_pass("bucket", graph, dumper, lambda: apply_buckets(graph, nodes, plan))
    if cfg.enabled("schedule") and distributed:
        _run_pass("schedule", graph, dumper, lambda: apply_schedule(graph, cfg.prefetch))
    if cfg.enabled("lower"):
        algorithms = plan_algorithms(*find_ns_sites(graph), policy=cfg.ns_algorithm, products=cfg.sym_products, epilogue=cfg.ns_epilogue)
        log.debug("algorithm plan:\n%s", algorithms.describe())
        explain.note_plan(algorithms.describe())
        _run_pass("lower", graph, dumper, lambda: lower_ns_ops(graph, algorithms))
    if cfg.enabled("stack_writes") and (writes := plan_stack_writes(graph)):
        explain.note_plan("stacked writes:\n" + "\n".join("  " + w.describe() for w in writes))
        _run_pass("stack_writes", graph, dumper, lambda: apply_stack_writes(graph, writes))
    if cfg.enabled("write_source") and (swaps := plan_write_sources(graph)):
        _run_pass("write_source", graph, dumper, lambda: apply_write_sources(graph, swaps))


UserPasses = Callable[[fx.Graph], None] | Sequence[Callable[[fx.Graph], None]] | None


class MuonGraphPass(CustomGraphPass):
    """The pipeline as Inductor's ``post_grad_custom_post_pass``, followed by the user's own
    post-grad passes (``user_passes``: one callable, a list of them, or None).

    ``uuid()`` combines a hash of every source file of this package, the configuration
    that changes the output, the rank key (:func:`muon_compile.cache_key.rank_key`) and
    the user passes' own ``uuid()``, so the FX graph cache stays valid, hits when nothing
    changed, and never serves one rank another rank's graph. A user pass that is no
    ``CustomGraphPass`` (or has no uuid) makes it None: Inductor then bypasses the cache,
    as it does for such a pass on its own.
    """

    def __init__(
        self,
        cfg: config_mod.Config,
        rank_key: tuple = (),
        dump_name: str | None = None,
        user_passes: UserPasses = None,
    ) -> None:
        self.cfg = cfg
        self.rank_key = rank_key
        self.dump_name = dump_name  # where the dumps go; not part of uuid()
        if user_passes is None:
            user_passes = ()
        self.user_passes = tuple(user_passes) if isinstance(user_passes, (list, tuple)) else (user_passes,)
        inference_aware = getattr(custom_graph_pass, "CustomInferenceAwareGraphPass", ())
        for p in self.user_passes:
            if not callable(p) or isinstance(p, inference_aware):
                raise ValueError(
                    f"post_grad_custom_post_pass must be a callable taking an fx.Graph (a CustomGraphPass "
                    f"to keep the FX graph cache), got {p!r}"
                )

    def __call__(self, graph: fx.Graph) -> None:
        run_passes(graph, self.cfg, self.dump_name)
        for p in self.user_passes:
            p(graph)

    def uuid(self) -> Any:
        user_ids = tuple(p.uuid() if isinstance(p, CustomGraphPass) else None for p in self.user_passes)
        if any(u is None for u in user_ids):
            return None
        # under Triton's interpreter (the tests) the CPU runs this package's kernels, and the
        # passes plan for them (stack_writes)
        kernels = triton_support.interpreted()
        return (sources_hash(muon_compile), repr(self.cfg.cache_key()), repr(self.rank_key), user_ids, kernels)

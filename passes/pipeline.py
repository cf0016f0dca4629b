"""The pipeline, top to bottom: canonicalize on the Dynamo graph (before AOTAutograd),
then on the post-grad graph find -> plan -> distribute -> bucket -> schedule -> lower.

Each pass is named; with ``MUON_COMPILE_DUMP_DIR`` set, the graph before and after each
pass is written there in the normalised text of :mod:`graph_text`; after each pass the
graph contract is checked (lint, fake ``meta['val']`` everywhere, no new aliasing
of outputs).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from muon_compile import config as config_mod
from muon_compile.stats import counters

from .bucket import apply_buckets
from .canonicalize import apply_canonical, plan_canonical, reject_log
from .distribute import apply_distribution
from .find import find_ns_sites
from .graph_text import graph_text
from .graph_utils import alias_pattern, check_contract
from .lower import lower_ns_ops
from .plan import Strategy, plan_buckets, plan_distributed
from .schedule import apply_schedule

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
    log.debug("pass %s took %.3f s", name, time.perf_counter() - start)
    dumper.write(name, "after", graph)


def run_torch_passes(gm: fx.GraphModule, cfg: config_mod.Config, dump_name: str | None = None) -> None:
    """Run the torch-level pass (canonicalize) on a Dynamo graph module, in place."""
    if not cfg.enabled("canonicalize"):
        return
    matches, rejected = plan_canonical(gm.graph)
    reject_log(rejected)
    if not matches:
        return
    dumper = _Dumper(cfg.dump_dir, dump_name)
    _run_pass("canonicalize", gm.graph, dumper, lambda: apply_canonical(gm.graph, matches), "example_value")
    gm.recompile()


def run_passes(graph: fx.Graph, cfg: config_mod.Config, dump_name: str | None = None) -> None:
    """Run the enabled post-grad passes of ``cfg`` on ``graph``, in place."""
    nodes, sites = find_ns_sites(graph)
    if not nodes:
        return
    counters["find.ns_ops"] += len(nodes)
    dumper = _Dumper(cfg.dump_dir, dump_name)
    distributed = False
    if cfg.enabled("distribute"):
        strategy = Strategy.ALL_GATHER if cfg.strategy == "all_gather" else Strategy.ALL_TO_ALL
        dist_plan = plan_distributed(sites, bucket_mb=cfg.bucket_mb, strategy=strategy)
        if dist_plan.buckets or dist_plan.skipped:
            log.debug("distribution plan:\n%s", dist_plan.describe())
            _run_pass("distribute", graph, dumper, lambda: apply_distribution(graph, nodes, dist_plan))
            distributed = bool(dist_plan.buckets)
    if cfg.enabled("bucket"):
        plan = plan_buckets(sites, bucket_mb=cfg.bucket_mb, pad_waste=cfg.pad_waste)
        if plan.buckets or plan.skipped:
            log.debug("bucket plan for %d NS ops:\n%s", len(nodes), plan.describe())
            _run_pass("bucket", graph, dumper, lambda: apply_buckets(graph, nodes, plan))
    if cfg.enabled("schedule") and distributed:
        _run_pass("schedule", graph, dumper, lambda: apply_schedule(graph, cfg.prefetch))
    if cfg.enabled("lower"):
        _run_pass("lower", graph, dumper, lambda: lower_ns_ops(graph))


_SOURCES = tuple(
    str(p)
    for p in sorted(Path(__file__).parent.glob("*.py"))
    + [Path(config_mod.__file__).parent / f for f in ("ns_kernel.py", "ns_op.py", "sharded_ns.py", "coefficients.py", "config.py")]
)


class MuonGraphPass(CustomGraphPass):
    """The pipeline as Inductor's ``post_grad_custom_post_pass``.

    ``uuid()`` hashes the pass sources, the configuration that changes the output and the
    rank key (:func:`muon_compile.backend.rank_key`), so the FX graph cache stays valid,
    hits when nothing changed, and never serves one rank another rank's graph.
    """

    def __init__(self, cfg: config_mod.Config, rank_key: tuple = (), dump_name: str | None = None) -> None:
        self.cfg = cfg
        self.rank_key = rank_key
        self.dump_name = dump_name  # where the dumps go; not part of uuid()

    def __call__(self, graph: fx.Graph) -> None:
        run_passes(graph, self.cfg, self.dump_name)

    def uuid(self) -> bytes:
        return get_hash_for_files(_SOURCES) + repr((self.cfg.cache_key(), self.rank_key)).encode()

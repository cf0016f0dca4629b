"""The pipeline: the table of passes (:data:`.table.PASSES`) run on a graph, the torch-level ones
on the Dynamo graph (before AOTAutograd), the post-grad ones after ``find`` on the post-grad graph,
then the user's own post-grad passes, if any (:class:`MuonGraphPass`).

With ``MUON_COMPILE_DUMP_DIR`` set, the graph before and after each pass that runs is written
there in the normalised text of :mod:`.graph_text`; after each the graph contract is checked
(lint, fake values everywhere, no new aliasing of outputs). Each pass's time, planning
included, adds to ``pass_seconds[name]``.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch.fx as fx
from torch._inductor import custom_graph_pass
from torch._inductor.custom_graph_pass import CustomGraphPass

import muon_compile
from muon_compile import config as config_mod
from muon_compile.compile.cache_key import sources_hash
from muon_compile.diagnostics import explain
from muon_compile.diagnostics.counters import counters, pass_seconds, timed
from muon_compile.kernels import triton_support

from .find import find_ns_sites
from .graph_text import graph_text
from .graph_utils import alias_pattern, check_contract, ns_call
from .table import PASSES, Context, Level

log = logging.getLogger(__name__)
_graph_ids = itertools.count()


def new_dump_name() -> str:
    """A directory name for the dumps of one compiled graph (torch-level and post-grad)."""
    return f"graph_{os.getpid()}_{next(_graph_ids)}"


class _Dumper:
    """Writes ``<dump_dir>/<name>/<nn>_<pass>_{before,after}.txt`` when a dump dir is set;
    the directory is made at the first write."""

    def __init__(self, dump_dir: str | None, name: str | None = None) -> None:
        self.dir = Path(dump_dir) / (name or new_dump_name()) if dump_dir else None
        self.seq = None

    def write(self, pass_name: str, stage: str, graph: fx.Graph) -> None:
        if self.dir is None:
            return
        if self.seq is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.seq = itertools.count(len(list(self.dir.glob("*.txt"))))
        (self.dir / f"{next(self.seq):02d}_{pass_name}_{stage}.txt").write_text(graph_text(graph))


def _run(level: Level, ctx: Context, dumper: _Dumper) -> None:
    """Plan, report and (where the plan runs anything) apply each enabled pass of ``level``."""
    for p in PASSES:
        if p.level is not level or not ctx.cfg.enabled(p.name):
            continue
        before = pass_seconds[p.name]
        with timed(p.name):
            plan = p.plan(ctx)
            p.report(ctx, plan)
            if not p.runs(plan):
                continue
            dumper.write(p.name, "before", ctx.graph)
            aliasing = alias_pattern(ctx.graph)
            p.apply(ctx, plan)
            check_contract(ctx.graph, p.name, aliasing, p.meta_key)
            dumper.write(p.name, "after", ctx.graph)
        log.debug("pass %s took %.3f s", p.name, pass_seconds[p.name] - before)


def run_torch_passes(
    gm: fx.GraphModule, cfg: config_mod.Config, dump_name: str | None = None, example_inputs: Sequence[Any] = ()
) -> None:
    """Run the torch-level passes on a Dynamo graph module, in place; ``example_inputs`` are
    the real inputs it is compiled for (one per placeholder). Their time adds to
    ``pass_seconds["torch_passes"]`` too."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    values = dict(zip(placeholders, example_inputs)) if len(placeholders) == len(example_inputs) else {}
    with timed("torch_passes"):
        _run(Level.TORCH, Context(gm.graph, cfg, gm=gm, values=values), _Dumper(cfg.dump_dir, dump_name))


def run_passes(graph: fx.Graph, cfg: config_mod.Config, dump_name: str | None = None) -> None:
    """Run ``find`` and the enabled post-grad passes of ``cfg`` on ``graph``, in place; their
    time adds to ``pass_seconds["post_grad_passes"]`` too."""
    with timed("post_grad_passes"):
        nodes, sites = find_ns_sites(graph)
        if not nodes:
            return
        counters["find.ns_ops"] += len(nodes)
        explain.note_plan("\n".join(f"site {i}: {explain.source_line(n)}" for i, n in enumerate(nodes)))
        if symbolic := [n for n, site in zip(nodes, sites) if site.symbolic]:
            explain.warn_symbolic_shapes([str(tuple(ns_call(n).input.meta["val"].shape)) for n in symbolic])
        _run(Level.POST_GRAD, Context(graph, cfg, nodes, sites), _Dumper(cfg.dump_dir, dump_name))


UserPasses = Callable[[fx.Graph], None] | Sequence[Callable[[fx.Graph], None]] | None


class MuonGraphPass(CustomGraphPass):
    """The pipeline as Inductor's ``post_grad_custom_post_pass``, followed by the user's own
    post-grad passes (``user_passes``: one callable, a list of them, or None).

    ``uuid()`` combines a hash of every source file of this package, the configuration
    that changes the output, the rank key (:func:`muon_compile.compile.cache_key.rank_key`) and
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

"""The passes of the ``muon`` backend, in the order they run: one table, :data:`PASSES`.

Each :class:`Pass` is a name, the graph it runs on, a line saying what it does, and three steps:
``plan`` reads the graph into plain data, ``report`` logs what of that plan is worth saying and
records it in the explanation, ``apply`` rewrites the graph by it, where the plan ``runs``
anything (a pass that does not is not dumped or checked). :mod:`.pipeline` runs the table;
``MUON_COMPILE_PASSES`` takes its names (:func:`names`); docs/design.md's pass table lists them in
this order (tests/passes/test_passes.py holds the two equal).

Before the post-grad passes, ``find`` reads the graph's Newton–Schulz op nodes and their sites
(:class:`Context`); it always runs, so it is no entry of the table.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch.fx as fx

from muon_compile import config as config_mod
from muon_compile.diagnostics import explain
from muon_compile.diagnostics.counters import counters
from muon_compile.distributed import routing
from muon_compile.ns import op as ns_op

from .bucket.apply import apply_buckets
from .bucket.plan import plan_buckets
from .canonicalize.apply import apply_canonical, plan_canonical, reject_log
from .canonicalize.near_miss import unseen_loops
from .distribute.apply import apply_distribution
from .distribute.plan import plan_distributed
from .find import find_ns_sites
from .lower.apply import lower_ns_ops
from .lower.plan import plan_algorithms
from .schedule import apply_schedule
from .writes.stack_writes import apply_stack_writes, plan_stack_writes
from .writes.write_source import apply_write_sources, plan_write_sources

log = logging.getLogger(__name__)


class Level(enum.Enum):
    """The graph a pass runs on."""

    TORCH = "torch"  # Dynamo's graph, before AOTAutograd (fake values in meta["example_value"])
    POST_GRAD = "post_grad"  # Inductor's post-grad graph (meta["val"])


@dataclasses.dataclass
class Context:
    """What the passes of one graph read and hand on: the graph, the configuration, and
    (post-grad) ``find``'s op nodes and sites; ``distributed`` once ``distribute`` placed a
    bucket (``schedule`` orders only those). At the torch level, ``gm`` and the example
    input of each placeholder (``values``)."""

    graph: fx.Graph
    cfg: config_mod.Config
    nodes: list[fx.Node] = dataclasses.field(default_factory=list)
    sites: list = dataclasses.field(default_factory=list)
    distributed: bool = False
    gm: fx.GraphModule | None = None
    values: Mapping[fx.Node, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Pass:
    """One pass: see the module docstring."""

    name: str
    level: Level
    does: str
    plan: Callable[[Context], Any]
    apply: Callable[[Context, Any], None]
    report: Callable[[Context, Any], None] = lambda ctx, plan: None
    runs: Callable[[Any], bool] = bool

    @property
    def meta_key(self) -> str:
        """Where the graph contract finds each node's fake value after this pass."""
        return "example_value" if self.level is Level.TORCH else "val"


def _note(text: str, kind: str) -> None:
    log.debug("%s:\n%s", kind, text)
    explain.note_plan(text)


def _has_buckets_or_skips(plan: Any) -> bool:
    return bool(plan.buckets or plan.skipped)


def _report_buckets(kind: Callable[[Context], str]) -> Callable[[Context, Any], None]:
    """A bucket plan's report: its description, where it has buckets or skipped sites."""
    def report(ctx: Context, plan: Any) -> None:
        if _has_buckets_or_skips(plan):
            _note(plan.describe(), kind(ctx))
    return report


# ----------------------------------------------------------------------------------- canonicalize
def _plan_canonical(ctx: Context) -> tuple[list, list, list]:
    matches, rejected = plan_canonical(ctx.graph, ctx.values)
    unseen = unseen_loops(ctx.graph, [m.chain for m in matches] + [r.chain for r in rejected])
    return matches, rejected, unseen


def _report_canonical(ctx: Context, plan: tuple[list, list, list]) -> None:
    matches, rejected, unseen = plan
    reject_log(rejected)
    for m in matches:
        fixed = "".join(f"; {n.name} = {v.tolist()} compiled in" for n, v in m.chain.fixed)
        explain.note_loop(m.chain.start, True, f"newton_schulz({m.args.describe()}){fixed}")
    for r in rejected:
        explain.note_loop(r.chain.start, False, r.reason)
    for node, reason in unseen:
        counters["canonicalize.unseen"] += 1
        log.info("Newton–Schulz-like loop at %s left as it was: %s", explain.source_line(node), reason)
        explain.note_loop(node, False, reason)


def _apply_canonical(ctx: Context, plan: tuple[list, list, list]) -> None:
    apply_canonical(ctx.graph, plan[0])
    ctx.gm.recompile()
    routed = ctx.graph.find_nodes(op="call_function", target=ns_op.newton_schulz_routed)
    routing.prepare_graph_inputs([n.args[0].meta["example_value"] for n in routed])


# ----------------------------------------------------------------------------------- post-grad
def _apply_distribution(ctx: Context, plan: Any) -> None:
    apply_distribution(ctx.graph, ctx.nodes, plan)
    ctx.distributed = bool(plan.buckets)


def _plan_algorithms(ctx: Context) -> Any:
    cfg = ctx.cfg
    return plan_algorithms(
        *find_ns_sites(ctx.graph), policy=cfg.ns_algorithm, products=cfg.sym_products, epilogue=cfg.ns_epilogue,
        orientation=cfg.ns_orientation,
    )


def _report_writes(ctx: Context, writes: list) -> None:
    if writes:
        explain.note_plan("stacked writes:\n" + "\n".join("  " + w.describe() for w in writes))


PASSES: tuple[Pass, ...] = (
    Pass(
        "canonicalize", Level.TORCH, "recognise Newton–Schulz loops and replace each by one op call",
        plan=_plan_canonical, report=_report_canonical, apply=_apply_canonical, runs=lambda plan: bool(plan[0]),
    ),
    Pass(
        "distribute", Level.POST_GRAD, "give each bucket of sharded sites one collective layout and its owners",
        plan=lambda ctx: plan_distributed(ctx.sites, bucket_mb=ctx.cfg.bucket_mb, strategy=ctx.cfg.strategy),
        report=_report_buckets(lambda ctx: "distribution plan"),
        apply=_apply_distribution, runs=_has_buckets_or_skips,
    ),
    Pass(
        "bucket", Level.POST_GRAD, "batch the single-device sites of one canonical shape into one op call",
        plan=lambda ctx: plan_buckets(
            ctx.sites, bucket_mb=ctx.cfg.bucket_mb, pad_waste=ctx.cfg.pad_waste,
            orientation=ctx.cfg.ns_orientation, algorithm=ctx.cfg.ns_algorithm,
        ),
        report=_report_buckets(lambda ctx: f"bucket plan for {len(ctx.nodes)} NS ops"),
        apply=lambda ctx, plan: apply_buckets(ctx.graph, ctx.nodes, plan), runs=_has_buckets_or_skips,
    ),
    Pass(
        "schedule", Level.POST_GRAD, "order the distributed buckets' stages so communication overlaps compute",
        plan=lambda ctx: ctx.distributed, apply=lambda ctx, plan: apply_schedule(ctx.graph, ctx.cfg.prefetch),
    ),
    Pass(
        "lower", Level.POST_GRAD, "replace each op call by its products and pointwise steps, by the planned algorithm",
        plan=_plan_algorithms, report=lambda ctx, plan: _note(plan.describe(), "algorithm plan"),
        apply=lambda ctx, plan: lower_ns_ops(ctx.graph, plan), runs=lambda plan: True,
    ),
    Pass(
        "stack_writes", Level.POST_GRAD, "turn a bucket's per-parameter writes into one stacked write",
        plan=lambda ctx: plan_stack_writes(ctx.graph),
        report=_report_writes,
        apply=lambda ctx, plan: apply_stack_writes(ctx.graph, plan),
    ),
    Pass(
        "write_source", Level.POST_GRAD, "let the stacked write read the Newton–Schulz result as lower left it",
        plan=lambda ctx: plan_write_sources(ctx.graph), apply=lambda ctx, plan: apply_write_sources(ctx.graph, plan),
    ),
)


def names() -> tuple[str, ...]:
    """The passes' names, in pipeline order: what ``MUON_COMPILE_PASSES`` takes."""
    return tuple(p.name for p in PASSES)

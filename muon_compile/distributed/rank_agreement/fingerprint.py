"""fingerprint: what the ranks of a process group must agree on before compiling a step
graph whose collectives they will run together. Reads a Dynamo graph after
``canonicalize``; plain data out, the graph unchanged.

Facts, in the order a first difference is reported (:mod:`muon_compile.distributed.rank_agreement`):
  1. ``version``: torch's version and a hash of this package's sources;
  2. ``setting``: every ``MUON_COMPILE_*`` variable that changes the plan
     (:data:`muon_compile.config.PLAN_FIELDS`), spelled as in the environment;
  3. ``gradient``: each parameter the graph reads a gradient of (a placeholder whose
     source is ``<parameter>.grad``), keyed by that source, shown by the parameter's
     name where the optimizer has one;
  4. ``plan``: the distribution plan of the row-sharded Newton–Schulz sites, planned from
     this graph as the post-grad ``distribute`` pass will (:func:`plan_distributed` on
     :func:`find_ns_sites` ``(torch_level=True)``): buckets, members with their owners,
     collective kinds and sizes; sites set aside, with their reason;
  5. ``collective``: the other collectives: Newton–Schulz calls left to DTensor's own
     sharding rule, and explicit functional collectives, in graph order.
Only values that every rank computes alike enter: global shapes, owners and split sizes,
never a local shard's shape, a rank or a process group's name.

Each process group the graph communicates over (the group of a sharded site or
collective, or of a sharded mesh dimension of a DTensor input) gets the facts 1-3 and
the facts 4-5 that concern it. A graph with no such group has no fingerprint.

Before / after (FSDP2, W = 2, three Muon matrices, one bucket)::

    ns = sharded_newton_schulz(g0.to_local(), 24, "0", 2, ...); ... (3 calls)
 -> Fingerprint(groups={"0": (Fact("version", "torch", "2.13.0+cpu"), ...,
                               Fact("setting", "MUON_COMPILE_BUCKET_MB", "64"), ...,
                               Fact("gradient", "L['args'][0].param_groups[0]['params'][0].grad", "layers.0.weight"), ...,
                               Fact("plan", "bucket 0", "all_to_all over 2 ranks, ...: 0:24x16->0, ..."))})
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.distributed.tensor import DTensor, Replicate

import muon_compile
from muon_compile import config as config_mod
from muon_compile.compile.cache_key import sources_hash
from muon_compile.distributed.routing import Kind, layout_of
from muon_compile.ns.op import NEWTON_SCHULZ, newton_schulz_routed

from ...passes.distribute.plan import DistBucket, plan_distributed
from ...passes.find import NSSite, find_ns_sites
from ...passes.graph_utils import ns_call

KINDS = ("version", "setting", "gradient", "plan", "collective")


@dataclasses.dataclass(frozen=True)
class Fact:
    """One thing the ranks must agree on: its ``kind`` (:data:`KINDS`), a ``key`` naming
    it alike on every rank, and its ``value`` as shown to the user."""

    kind: str
    key: str
    value: str


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """Per process group name, in a fixed order, the facts its ranks must agree on."""

    groups: dict[str, tuple[Fact, ...]]

    def as_lists(self) -> dict[str, list[list[str]]]:
        """Per group, its facts as ``[kind, key, value]`` lists (what the ranks exchange)."""
        return {name: [[f.kind, f.key, f.value] for f in facts] for name, facts in self.groups.items()}


def fingerprint(
    gm: fx.GraphModule, example_inputs: Sequence[Any], cfg: config_mod.Config, f_locals: dict | None = None
) -> Fingerprint | None:
    """The fingerprint of a Dynamo graph after ``canonicalize`` (None without collectives).

    ``f_locals``: the traced frame's locals, to find the parameter names the optimizer
    was given (``torch.optim`` keeps them as ``param_groups[i]["param_names"]``).
    """
    per_group: dict[str, list[Fact]] = {name: [] for name in _sharded_input_groups(example_inputs)}
    collectives = _collective_facts(gm.graph)
    if not per_group and not collectives:  # one device: nothing to agree on, nothing more to read
        return None
    _, sites = find_ns_sites(gm.graph, torch_level=True)
    for group, fact in _plan_facts(sites, cfg) + collectives:
        per_group.setdefault(group, []).append(fact)
    common = _version_facts() + _setting_facts(cfg) + _gradient_facts(gm.graph, f_locals)
    order = {kind: i for i, kind in enumerate(KINDS)}
    return Fingerprint(
        {name: tuple(common + sorted(facts, key=lambda f: order[f.kind])) for name, facts in sorted(per_group.items())}
    )


def _sharded_input_groups(example_inputs: Sequence[Any]) -> list[str]:
    """The process groups of the sharded (not replicated) mesh dimensions of DTensor inputs."""
    names = []
    for t in example_inputs:
        if isinstance(t, DTensor):
            mesh = t.device_mesh
            for dim, placement in enumerate(t.placements):
                if not isinstance(placement, Replicate) and mesh.size(dim) > 1:
                    names.append(mesh.get_group(dim).group_name)
    return list(dict.fromkeys(names))


def _version_facts() -> list[Fact]:
    return [
        Fact("version", "torch", torch.__version__),
        Fact("version", "the muon_compile sources", sources_hash(muon_compile).hex()[:16]),
    ]


def _setting_facts(cfg: config_mod.Config) -> list[Fact]:
    return [Fact("setting", name, value) for name, value in cfg.plan_settings()]


# ``<optimizer>.param_groups[g]['params'][i]``, and a module path's attribute steps.
_GROUP_PARAM = re.compile(r"^(?P<optimizer>.+)\.param_groups\[(?P<group>\d+)\]\['params'\]\[(?P<index>\d+)\]$")
_MODULE_STEP = re.compile(r"\._(?:modules|parameters)\['([^']+)'\]")
_LOCAL = re.compile(r"^L\['([^']+)'\]")


def parameter_label(source: str, f_locals: dict | None) -> str:
    """A readable name for the parameter read by the source expression ``source``: the
    optimizer's name for it when it has one (``layers.0.weight``), else the source with
    module steps as dots (``model.layers.0.weight``) or from its param group on
    (``param_groups[0]['params'][1]``)."""
    match = _GROUP_PARAM.match(source)
    if match:
        names = None
        if f_locals is not None:
            try:  # the optimizer, by the source expression Dynamo built from these locals
                optimizer = eval(match["optimizer"], {"__builtins__": {}}, {"L": f_locals})  # noqa: S307
                names = optimizer.param_groups[int(match["group"])].get("param_names")
            except Exception:  # not resolvable here: fall back to the source
                names = None
        if names:
            return str(names[int(match["index"])])
        return f"param_groups[{match['group']}]['params'][{match['index']}]"
    return _LOCAL.sub(r"\1", _MODULE_STEP.sub(lambda m: "." + m.group(1), source))


def _gradient_facts(graph: fx.Graph, f_locals: dict | None) -> list[Fact]:
    facts = []
    for node in graph.find_nodes(op="placeholder"):
        source = getattr(node.meta.get("grapharg"), "source", None)
        name = source.name() if callable(getattr(source, "name", None)) else getattr(source, "name", None)
        if isinstance(name, str) and name.endswith(".grad"):
            facts.append(Fact("gradient", name, parameter_label(name[: -len(".grad")], f_locals)))
    return facts


def _shape(rows: int, cols: int) -> str:
    return f"{rows}x{cols}"


def _bucket_value(bucket: DistBucket) -> str:
    members = ", ".join(m.describe() for m in bucket.members)
    collectives = "; ".join(f"{kind} {sizes}" for kind, _, sizes in bucket.collectives())
    return f"{bucket.strategy.value} over {bucket.group_size} ranks, {bucket.args.describe()}: {members} [{collectives}]"


def _plan_facts(sites: list[NSSite], cfg: config_mod.Config) -> list[tuple[str, Fact]]:
    """``(group name, fact)`` for the plan of the sharded sites (see the module docstring)."""
    sharded = [s for s in sites if s.sharding is not None]
    if not sharded:
        return []
    if not cfg.enabled("distribute"):
        return [
            (s.sharding.group_name, Fact("plan", f"sharded site {s.index}", f"{_shape(s.rows, s.cols)} gathered alone"))
            for s in sharded
        ]
    plan = plan_distributed(sites, bucket_mb=cfg.bucket_mb, strategy=cfg.strategy)
    facts = [(b.group_name, Fact("plan", f"bucket {i}", _bucket_value(b))) for i, b in enumerate(plan.buckets)]
    by_index = {s.index: s for s in sites}
    for index, reason in plan.skipped:
        s = by_index[index]
        facts.append((s.sharding.group_name, Fact("plan", f"sharded site {index}", f"{_shape(s.rows, s.cols)} not bucketed: {reason}")))
    return facts


def _functional_collective(node: fx.Node) -> str | None:
    """The name of the ``_c10d_functional`` collective ``node`` calls (not ``wait_tensor``), or None."""
    target = node.target
    name = getattr(target, "_qualified_op_name", None) or getattr(target, "name", lambda: None)()
    if not isinstance(name, str) or not name.startswith("_c10d_functional::"):
        return None
    kind = name.split("::", 1)[1].split(".", 1)[0]
    return None if kind == "wait_tensor" else kind


def _collective_facts(graph: fx.Graph) -> list[tuple[str, Fact]]:
    """``(group name, fact)`` for NS calls left to DTensor and explicit functional collectives."""
    facts = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        kind = _functional_collective(node)
        if kind is not None:
            group = node.kwargs.get("group_name", node.args[-1] if node.args else None)
            value = node.meta.get("example_value")
            shape = "" if kind.startswith("all_to_all") or value is None else f" {value.dtype} {list(value.shape)}"
            facts.append((str(group), Fact("collective", f"collective {len(facts)}", f"{kind}{shape}")))
            continue
        if node.target is NEWTON_SCHULZ or node.target is newton_schulz_routed:
            x = ns_call(node).input.meta.get("example_value")
            if isinstance(x, DTensor) and layout_of(x).kind is Kind.DTENSOR:
                fact = Fact("collective", f"collective {len(facts)}", f"Newton–Schulz of {list(x.shape)} {x.placements} by DTensor's rule")
                facts += [(name, fact) for name in _sharded_input_groups([x])]
    return facts

"""Graph helpers shared by the passes: trace-and-splice, ordering, the graph contract."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
import torch.fx as fx
from torch._dispatch.python import enable_python_dispatcher
from torch._guards import detect_fake_mode
from torch._inductor.decomposition import select_decomp_table
from torch._inductor.pattern_matcher import stable_topological_sort
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import make_fx

from muon_compile.distributed import routing
from muon_compile.distributed import sharded_op as sharded_ns
from muon_compile.distributed.sharded_op import SHARDED_NEWTON_SCHULZ, ShardLayout
from muon_compile.ns import op as ns_op
from muon_compile.ns.args import NSArgs
from muon_compile.ns.op import NEWTON_SCHULZ
from muon_compile.passes.fx_writes import local_value

NS_TARGETS = (NEWTON_SCHULZ, SHARDED_NEWTON_SCHULZ)
# In a Dynamo graph, canonicalize routes a DTensor's Newton–Schulz through this call,
# which picks the op for the layout when AOTAutograd traces it.
TORCH_NS_TARGETS = NS_TARGETS + (ns_op.newton_schulz_routed,)

__all__ = [
    "NS_TARGETS",
    "TORCH_NS_TARGETS",
    "GraphContractError",
    "NSCall",
    "check_contract",
    "alias_pattern",
    "escapes_to_output",
    "local_value",
    "ns_call",
    "ns_nodes",
    "splice_trace",
    "stable_topological_sort",
]


class GraphContractError(RuntimeError):
    """A pass left the graph in a state the pipeline promises never to produce."""


def ns_nodes(graph: fx.Graph, targets: Sequence = NS_TARGETS) -> list[fx.Node]:
    """The call nodes of the Newton–Schulz ops in ``targets`` (default: both), in graph order."""
    found = {n for t in targets for n in graph.find_nodes(op="call_function", target=t)}
    return [n for n in graph.nodes if n in found]


@dataclasses.dataclass(frozen=True)
class NSCall:
    """A Newton–Schulz op node's arguments: its input node, what it computes and, for the
    sharded op, how the matrix is spread over its group (None for the plain op)."""

    input: fx.Node
    args: NSArgs
    shard: ShardLayout | None


def ns_call(node: fx.Node) -> NSCall:
    """The arguments of an NS op node (see :data:`TORCH_NS_TARGETS`); a routed call's
    layout is its DTensor's where that is sharded over a group."""
    if node.target is SHARDED_NEWTON_SCHULZ:
        x, shard, args = sharded_ns.split_args(node.args)
        return NSCall(x, args, shard)  # type: ignore[arg-type]
    if node.target is ns_op.newton_schulz_routed:
        x, args = node.args[0], NSArgs.from_op(node.args[1:])
        return NSCall(x, args, routing.layout_of(x.meta["example_value"]).shard)  # type: ignore[arg-type]
    x, args = ns_op.split_args(node.args)
    return NSCall(x, args, None)  # type: ignore[arg-type]


def splice_trace(
    graph: fx.Graph,
    fn: Callable[..., Sequence[torch.Tensor]],
    inputs: Sequence[fx.Node],
    insert_before: fx.Node,
    meta: dict | None = None,
) -> list[fx.Node]:
    """Trace ``fn`` on ``inputs``' fake values with Inductor's decompositions and copy its
    nodes into ``graph`` before ``insert_before`` (each with ``meta`` added to its
    ``node.meta``); return the nodes of ``fn``'s outputs."""
    examples = [n.meta["val"] for n in inputs]
    fake_mode = detect_fake_mode(examples)
    if fake_mode is None:
        raise GraphContractError("splice_trace needs FakeTensor meta['val'] on every input node")
    with fake_mode, enable_python_dispatcher():
        traced = make_fx(fn, decomposition_table=select_decomp_table())(*examples)
    traced.graph.eliminate_dead_code()  # decompositions that bail out leave dead casts
    env: dict[fx.Node, fx.Node] = {}
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    env.update(zip(placeholders, inputs))
    outputs: list[fx.Node] = []
    with graph.inserting_before(insert_before):
        for node in traced.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                outputs = [env[o] for o in node.args[0]]
                continue
            if node.target is torch.ops.aten.detach.default:
                env[node] = env[node.args[0]]
                continue
            env[node] = graph.node_copy(node, lambda n: env[n])
            env[node].meta.update(meta or {})
    return outputs


def escapes_to_output(node: fx.Node) -> bool:
    """Whether ``node``'s value, directly or through views, is a graph output."""
    frontier = [node]
    seen: set[fx.Node] = set()
    while frontier:
        n = frontier.pop()
        if n in seen:
            continue
        seen.add(n)
        for user in n.users:
            if user.op == "output":
                return True
            if isinstance(user.target, torch._ops.OpOverload) and user.target.is_view:
                frontier.append(user)
    return False


def _view_root(node: object) -> object:
    while isinstance(node, fx.Node) and isinstance(node.target, torch._ops.OpOverload) and node.target.is_view:
        node = node.args[0]
    return node


def alias_pattern(graph: fx.Graph) -> tuple:
    """How the graph outputs alias: per output, the input it is a view of (by name), or
    the index of the first output sharing its computed base; ``None`` for non-nodes."""
    output = graph.output_node()
    if output is None:
        return ()
    pattern: list = []
    first_seen: dict[fx.Node, int] = {}
    for i, out in enumerate(output.args[0]):
        root = _view_root(out)
        if not isinstance(root, fx.Node):
            pattern.append(None)
        elif root.op == "placeholder":
            pattern.append(("input", root.target))
        else:
            pattern.append(("computed", first_seen.setdefault(root, i)))
    return tuple(pattern)


def check_contract(graph: fx.Graph, pass_name: str, aliasing_before: tuple, meta_key: str = "val") -> None:
    """Lint the graph; every computed node has a FakeTensor ``meta[meta_key]`` (``"val"``
    post-grad, ``"example_value"`` in a Dynamo graph); the outputs alias inputs and each
    other exactly as before (``aliasing_before`` from :func:`alias_pattern`)."""
    try:
        graph.lint()
    except Exception as e:  # lint raises several exception types; re-raise as ours, chained
        raise GraphContractError(f"pass {pass_name!r} left an invalid graph: {e}") from e
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        val = node.meta.get(meta_key)
        if val is None and node.users:
            raise GraphContractError(f"pass {pass_name!r} left node {node.name} without meta[{meta_key!r}]")
        if isinstance(val, torch.Tensor) and not isinstance(local_value(val), FakeTensor):
            raise GraphContractError(f"pass {pass_name!r} left a real tensor in {node.name}.meta[{meta_key!r}]")
    if alias_pattern(graph) != aliasing_before:
        raise GraphContractError(f"pass {pass_name!r} changed how the graph outputs alias inputs or each other")

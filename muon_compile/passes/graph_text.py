"""A normalised, readable text form of an FX graph, for golden files and dumps.

One line per node, values renamed in order (``in0``, ``v0``, ...) so an unrelated
renaming upstream does not churn the golden files; a node of a distributed bucket ends
with the bucket and stage it belongs to::

    v3: bf16[6, 16, 48] = aten.bmm(v1, v2)
    v9: bf16[640] = _c10d_functional.all_to_all_single(v8, [320, 320], [448, 192], '1')  # bucket 0 launch
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .distribute.stages import stage_of

_DTYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.bool: "b8",
}


def _val(node: fx.Node) -> object:
    """The fake value of a node: ``val`` post-grad, ``example_value`` in a Dynamo graph."""
    return node.meta.get("val", node.meta.get("example_value"))


def _type(val: object) -> str:
    if isinstance(val, torch.Tensor):
        dims = ", ".join(str(d) for d in val.shape)
        return f"{_DTYPES.get(val.dtype, str(val.dtype))}[{dims}]"
    if isinstance(val, (list, tuple)):
        return "(" + ", ".join(_type(v) for v in val) + ")"
    return type(val).__name__ if val is not None else "none"


def _target(node: fx.Node) -> str:
    t = node.target
    if node.op == "call_method":
        return f".{t}"
    if isinstance(t, torch._ops.OpOverload):
        ns, name = t.namespace, t._schema.name.split("::")[-1]
        overload = "" if t._overloadname == "default" else f".{t._overloadname}"
        return f"{ns}.{name}{overload}"
    return getattr(t, "__name__", str(t))


def _arg(a: object, names: dict[fx.Node, str]) -> str:
    if isinstance(a, fx.Node):
        return names[a]
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_arg(x, names) for x in a)
        return f"[{inner}]"
    if isinstance(a, float):
        return repr(a)
    if isinstance(a, torch.dtype):
        return _DTYPES.get(a, str(a))
    return repr(a) if isinstance(a, str) else str(a)


def graph_text(graph: fx.Graph) -> str:
    """The normalised text of ``graph`` (ends with a newline)."""
    names: dict[fx.Node, str] = {}
    lines = []
    n_in = n_val = 0
    for node in graph.nodes:
        if node.op == "placeholder":
            names[node] = f"in{n_in}"
            n_in += 1
            lines.append(f"{names[node]}: {_type(_val(node))}")
        elif node.op == "output":
            lines.append(f"return {_arg(node.args[0], names)}")
        else:
            names[node] = f"v{n_val}"
            n_val += 1
            args = [_arg(a, names) for a in node.args]
            args += [f"{k}={_arg(v, names)}" for k, v in node.kwargs.items()]
            stage = stage_of(node)
            tag = f"  # {stage}" if stage else ""
            lines.append(f"{names[node]}: {_type(_val(node))} = {_target(node)}({', '.join(args)}){tag}")
    return "\n".join(lines) + "\n"

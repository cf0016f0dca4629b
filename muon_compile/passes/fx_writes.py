"""The storage a node of an FX graph holds (through its fake value) and the tensors it writes
in place: read by the CUDA-graph decision (:mod:`muon_compile.compile.cuda_graphs`), ``canonicalize``'s
walk and the near-miss search (``passes/``)."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
from torch.distributed.tensor import DTensor
from torch.multiprocessing.reductions import StorageWeakRef

# Python's in-place operators and item assignment, as Dynamo records them on tensors.
_WRITES_FIRST = {
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
    operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift,
    operator.imatmul, operator.setitem,
}


def written_args(node: fx.Node) -> list[fx.Node]:
    """The argument nodes ``node`` writes in place (a conservative reading of its target)."""
    written = list(flat_nodes([node.kwargs.get("out")]))
    target = node.target
    if node.op == "call_function" and isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        schemas = [target._schema] if isinstance(target, torch._ops.OpOverload) else [
            getattr(target, name)._schema for name in target.overloads()
        ]
        for schema in schemas:
            for position, argument in enumerate(schema.arguments):
                if argument.alias_info is not None and argument.alias_info.is_write:
                    value = node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
                    written.extend(flat_nodes([value]))
        return written
    if node.op == "call_method":
        name = str(target)
    elif node.op == "call_function":
        if target in _WRITES_FIRST:
            return written + list(flat_nodes(node.args[:1]))
        name = getattr(target, "__name__", "")
    else:
        return written
    if name.endswith("_") and not name.endswith("__"):
        written.extend(flat_nodes(node.args[:1]))
    return written


def flat_nodes(values: Any) -> list[fx.Node]:
    """The FX nodes in ``values`` (nested lists and tuples)."""
    found: list[fx.Node] = []
    fx.node.map_arg(values, found.append)
    return found


def local_value(t: torch.Tensor) -> torch.Tensor:
    """A fake value's local tensor: the DTensor's shard, or the tensor itself."""
    return t._local_tensor if isinstance(t, DTensor) else t


def storage_of(node: Any) -> StorageWeakRef | None:
    """The storage of ``node``'s fake value (a DTensor's shard's), or None where it has none."""
    value = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return StorageWeakRef(local_value(value).untyped_storage())
    except (NotImplementedError, RuntimeError):  # a subclass without a storage of its own
        return None

"""How a tensor's matrices are laid out across ranks, which picks its Newton–Schulz op
(:func:`muon_compile.ns.op.newton_schulz_any`): plain, sharded over a group, or DTensor's own.

* a plain tensor, a replicated DTensor, or a 3-D DTensor sharded on its batch (expert)
  dimension only: every matrix is whole on this rank -> ``newton_schulz`` on the local tensor;
* a 3-D DTensor sharded also on a matrix dimension: as below, for each matrix of the local
  stack, over the mesh dimensions that shard the matrices (those of the batch dimension
  hold other matrices);
* a 2-D DTensor whose placements are ``Shard`` or ``_StridedShard`` of its rows or columns on
  one or more mesh dimensions (the rest ``Replicate``): FSDP2's ``Shard(0)``, tensor
  parallelism's ``Shard(0)`` / ``Shard(1)``, FSDP2 on top of tensor parallelism (a
  ``_StridedShard``), HSDP's ``(Replicate, Shard(0))`` and HSDP on top of tensor parallelism
  -> ``sharded_newton_schulz`` over the process group of the sharded mesh dimensions (one
  dimension's own group, or a group over several made by :func:`prepare`), which the
  ``distribute`` pass buckets. Each rank holds a block (:class:`~.sharded_ns.ShardLayout`);
* anything else (``Partial``, a strided sharding of a stack's batch dimension, a mesh whose ranks
  are not in row-major order, a group over several mesh dimensions that :func:`prepare` did
  not make; the backend makes it for a compiled graph's own calls, :func:`prepare_graph_inputs`)
  -> ``newton_schulz`` on the DTensor itself: DTensor's sharding rule replicates
  the input (one collective per matrix, correct, not bucketed). The reason is logged when
  the optimizer is built.

The tensor-parallel mode (:class:`~muon_compile.config.TPMode`; per optimizer, or
``MUON_COMPILE_TP_MODE``) applies to matrices sharded on a mesh dimension named in
``MUON_COMPILE_TP_DIMS``: ``distributed`` as above; ``duplicated`` the same layout, every rank
of the group orthogonalising the whole matrix; ``blockwise`` the matrix cut into its
tensor-parallel blocks (:func:`~muon_compile.distributed.sharded_op.tp_block`), each orthogonalised alone,
on this rank when no other mesh dimension shards it, else by owner over those dimensions.
"""

from __future__ import annotations

import dataclasses
import enum

import torch
import torch.distributed as dist
from torch import Tensor
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.placement_types import _StridedShard

from .. import config
from ..compile.compat import is_shard
from .sharded_op import ShardLayout, tp_block


class Kind(enum.Enum):
    LOCAL = "every matrix is whole on this rank"
    SHARDED = "blocks of each matrix spread over one process group"
    DTENSOR = "left to DTensor's sharding rule"


@dataclasses.dataclass(frozen=True)
class Layout:
    kind: Kind
    shard: ShardLayout | None = None
    reason: str | None = None


# the group of a DTensor's sharded mesh dimensions, by the names of those dimensions' own
# groups on this rank: (the group's name, or None and why not); filled by prepare(), outside
# any trace (a DeviceMesh's rank tensor cannot be read while Dynamo traces)
_GROUPS: dict[tuple[str, ...], tuple[str | None, str | None]] = {}


def _sharded_dims(x: DTensor) -> list[int]:
    """The mesh dimensions that shard ``x`` over more than one rank."""
    return [i for i, p in enumerate(x.placements) if not isinstance(p, Replicate) and x.device_mesh.size(i) > 1]


def _on_matrices(x: DTensor, mesh_dims: list[int]) -> list[int]:
    """Those of ``mesh_dims`` that shard ``x``'s matrices: a stack's batch dimension holds
    other matrices, so its mesh dimensions take no part in the group."""
    return mesh_dims if x.dim() == 2 else [i for i in mesh_dims if getattr(x.placements[i], "dim", None) != 0]


def _mode(tp_mode: config.TPMode | str | None) -> config.TPMode:
    """``tp_mode``, or ``MUON_COMPILE_TP_MODE`` where it is None."""
    return config.current().tp_mode if tp_mode is None else config.TPMode.parse(tp_mode)


def _not_tp(mesh_dims: list[int], tp: tuple[bool, ...]) -> list[int]:
    """Those of ``mesh_dims`` that are not tensor-parallel (``tp``: per dimension, whether it is)."""
    return [i for i, t in zip(mesh_dims, tp) if not t]


def _key(x: DTensor, mesh_dims: list[int]) -> tuple[str, ...]:
    """What names this rank's sub-mesh over ``mesh_dims``: the groups of its dimensions."""
    return tuple(x.device_mesh.get_group(i).group_name for i in mesh_dims)


def _not_made(x: DTensor, mesh_dims: list[int]) -> tuple[None, str]:
    return None, (
        f"placements {x.placements} shard {len(mesh_dims)} mesh dimensions, whose process group was not made "
        "(muon_compile.distributed.routing.prepare(param) makes it; muon_compile.Muon calls it)"
    )


def _make_group(x: DTensor, mesh_dims: list[int], create: bool) -> tuple[str | None, str | None]:
    """The group of this rank's sub-mesh over ``mesh_dims`` (made when ``create`` and there
    are several), or None and why not."""
    mesh = x.device_mesh
    index = tuple(slice(None) if i in mesh_dims else c for i, c in enumerate(mesh.get_coordinate()))
    with unset_fake_temporarily():  # torch 2.11 builds the mesh tensor on demand: not under a fake mode
        ranks = mesh.mesh[index].flatten().tolist()  # row-major
    if ranks != sorted(ranks):  # a group numbers its ranks in ascending order
        return None, f"the ranks {ranks} of its sub-mesh are not in row-major order"
    if len(mesh_dims) == 1:
        return mesh.get_group(mesh_dims[0]).group_name, None
    if not create:
        return _not_made(x, mesh_dims)
    return dist.new_group(ranks=ranks, use_local_synchronization=True).group_name, None


def _group(x: DTensor, mesh_dims: list[int]) -> tuple[str | None, str | None]:
    """:func:`_make_group`'s answer as :func:`prepare` kept it; where it did not, worked out
    now without making a group, or, while Dynamo traces, one dimension's own group (as if its
    ranks were in row-major order, as ``init_device_mesh`` makes them)."""
    if not torch.compiler.is_compiling():  # a kept group's liveness can be checked only outside the trace
        return _kept(x, mesh_dims) or _make_group(x, mesh_dims, create=False)
    kept = _GROUPS.get(_key(x, mesh_dims))
    if kept is not None:
        return kept
    if len(mesh_dims) == 1:
        return x.device_mesh.get_group(mesh_dims[0]).group_name, None
    return _not_made(x, mesh_dims)


def _kept(x: DTensor, mesh_dims: list[int]) -> tuple[str | None, str | None] | None:
    """What :func:`prepare` kept for ``x``'s mesh dimensions, unless its group has since gone."""
    kept = _GROUPS.get(_key(x, mesh_dims))
    return kept if kept is not None and (kept[0] is None or _alive(kept[0])) else None


def _alive(group_name: str) -> bool:
    """Whether a group of this name exists (a process group destroyed and made again leaves
    stale names behind)."""
    try:
        dist.distributed_c10d._resolve_process_group(group_name)
    except (KeyError, RuntimeError, ValueError):
        return False
    return True


def prepare(x: Tensor, tp_mode: config.TPMode | str | None = None) -> None:
    """Work out (and, for several sharded mesh dimensions, make) the process group of the mesh
    dimensions that shard ``x``'s matrices, and under ``blockwise`` that of those that are not
    tensor-parallel: every rank of that group must call it for the same tensors in the same
    order (the optimizer's constructor does), never inside a compiled region."""
    if not isinstance(x, DTensor) or x.device_mesh.get_coordinate() is None:
        return
    mesh_dims = _on_matrices(x, _sharded_dims(x))
    candidates = [mesh_dims]
    if _mode(tp_mode) is config.TPMode.BLOCKWISE:
        candidates.append(_not_tp(mesh_dims, _tp_positions(x, mesh_dims, config.current().tp_dims)))
    for dims in candidates:
        if dims and _kept(x, dims) is None:
            _GROUPS[_key(x, dims)] = _make_group(x, dims, create=True)


def prepare_graph_inputs(inputs: list[Tensor]) -> None:
    """:func:`prepare` for each DTensor input of a Dynamo graph's routed Newton–Schulz calls
    (their fake values), in graph order, before the graph is compiled: code that builds no
    ``muon_compile`` optimizer (``torch.optim.Muon``, a hand-written Muon) never called it, so
    a matrix sharded on several mesh dimensions (FSDP2 or HSDP over tensor parallelism) would be
    left to DTensor's collectives per matrix. Every rank compiles the same graph, so the ranks of
    each group make it together; a rank that compiles another graph leaves the others waiting
    here, as at ``muon_compile.Muon``'s construction."""
    with unset_fake_temporarily():
        for x in inputs:
            prepare(x)


@torch.compiler.assume_constant_result
def _split_factor(placement: object) -> int:
    """A ``_StridedShard``'s split factor, 0 for a ``Shard`` (read outside Dynamo's trace: the
    attribute is C++'s)."""
    return int(placement.split_factor) if isinstance(placement, _StridedShard) else 0


@torch.compiler.assume_constant_result
def _tp_block(whole: tuple, tp: tuple[bool, ...], mesh: object, mesh_dims: tuple[int, ...]) -> tuple | str:
    """:func:`~muon_compile.distributed.sharded_op.tp_block` of the layout ``whole`` (its fields but the
    group and the mode) at this rank's coordinates, as ``(rows, cols, mesh, dims, split)`` or
    the reason; worked out outside Dynamo's trace (the rank tensor cannot be read in it)."""
    coords = tuple(int(mesh.get_local_rank(d)) if t else 0 for d, t in zip(mesh_dims, tp))
    rows, cols, sizes, dims, split = whole
    block = tp_block(ShardLayout(rows, cols, "", sizes, dims, split), tp, coords)
    return block if isinstance(block, str) else (block.rows, block.cols, block.mesh, block.dims, block.split)


def _tp_positions(x: DTensor, mesh_dims: list[int], tp_dims: tuple[str, ...]) -> tuple[bool, ...]:
    """Per sharded mesh dimension, whether its name is one of the tensor-parallel ``tp_dims``."""
    names = x.device_mesh.mesh_dim_names or ()
    return tuple(bool(names) and names[i] in tp_dims for i in mesh_dims)


def layout_of(x: Tensor, tp_mode: config.TPMode | str | None = None) -> Layout:
    """How ``x``'s matrices are laid out across ranks (see the module docstring), under
    ``tp_mode`` (default: ``MUON_COMPILE_TP_MODE``)."""
    if not isinstance(x, DTensor):
        return Layout(Kind.LOCAL)
    mesh_dims = _sharded_dims(x)
    if not mesh_dims:
        return Layout(Kind.LOCAL)
    placements = [x.placements[i] for i in mesh_dims]
    if not all(is_shard(p) or isinstance(p, _StridedShard) for p in placements):
        return Layout(Kind.DTENSOR, reason=f"placements {x.placements}: only Shard and Replicate are laid out here")
    offset = x.dim() - 2  # a stack's matrices are its last two dimensions
    if offset:
        if any(p.dim == 0 and isinstance(p, _StridedShard) for p in placements):
            return Layout(Kind.DTENSOR, reason=f"placements {x.placements}: a strided sharding of the stack dimension")
        mesh_dims = _on_matrices(x, mesh_dims)
        placements = [x.placements[i] for i in mesh_dims]
        if not mesh_dims:
            return Layout(Kind.LOCAL)
    mode = _mode(tp_mode)
    tp = _tp_positions(x, mesh_dims, config.current().tp_dims)
    if not any(tp):
        mode = config.TPMode.DISTRIBUTED
    whole = ShardLayout(
        x.shape[-2], x.shape[-1], "",
        mesh=tuple(x.device_mesh.size(i) for i in mesh_dims),
        dims=tuple(p.dim - offset for p in placements),
        split=tuple(_split_factor(p) for p in placements),
        tp_mode=mode.value,
    )
    note = None
    if mode is config.TPMode.BLOCKWISE:
        block = _tp_block((whole.rows, whole.cols, whole.mesh, whole.dims, whole.split), tp, x.device_mesh, tuple(mesh_dims))
        if not isinstance(block, str):
            if not block[2]:  # the block is this rank's own: no communication
                return Layout(Kind.LOCAL, reason="tp blockwise: this rank's tensor-parallel block alone")
            sub = ShardLayout(*block[:2], "", *block[2:], tp_mode=mode.value)  # type: ignore[misc]
            return _sharded(x, _not_tp(mesh_dims, tp), sub)
        note = f"tp blockwise not possible ({block}); distributed by owner instead"
        whole = dataclasses.replace(whole, tp_mode=config.TPMode.DISTRIBUTED.value)
    return _sharded(x, mesh_dims, whole, note)


def _sharded(x: DTensor, mesh_dims: list[int], layout: ShardLayout, note: str | None = None) -> Layout:
    """``layout`` over the group of ``x``'s ``mesh_dims``, or DTensor's rule where that group is not known."""
    group_name, reason = _group(x, mesh_dims)
    if group_name is None:
        return Layout(Kind.DTENSOR, reason=reason)
    return Layout(Kind.SHARDED, dataclasses.replace(layout, group_name=group_name), note)


def wrap_like(local: Tensor, like: Tensor) -> Tensor:
    """``local`` as a DTensor with ``like``'s mesh, placements, global shape and stride
    (``local`` itself when ``like`` is a plain tensor)."""
    if not isinstance(like, DTensor):
        return local
    return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False, shape=like.shape, stride=like.stride())

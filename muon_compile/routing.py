"""How a tensor's matrices are laid out across ranks, which picks its Newton–Schulz op
(:func:`muon_compile.ns_op.newton_schulz_any`): plain, row-sharded (FSDP2), or DTensor's own.

* a plain tensor, a replicated DTensor, or a 3-D DTensor sharded on its batch (expert)
  dimension: every matrix is whole on this rank -> ``newton_schulz`` on the local tensor;
* a 2-D DTensor sharded ``Shard(0)`` on one mesh dimension (FSDP2, or the shard
  dimension of an HSDP ``(Replicate, Shard(0))`` mesh) -> ``sharded_newton_schulz`` over
  that dimension's process group, which the ``distribute`` pass buckets;
* anything else (``Shard(1)`` from tensor parallelism, ``Partial``, several sharded mesh
  dimensions) -> ``newton_schulz`` on the DTensor itself: DTensor's sharding rule
  replicates the input (one collective per matrix, correct, not bucketed). The reason is
  logged when the optimizer is built.
"""

from __future__ import annotations

import dataclasses
import enum

from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate

from .compat import is_shard


class Kind(enum.Enum):
    LOCAL = "every matrix is whole on this rank"
    ROWS = "rows sharded over one process group"
    DTENSOR = "left to DTensor's sharding rule"


@dataclasses.dataclass(frozen=True)
class Layout:
    kind: Kind
    group_name: str | None = None
    group_size: int = 1
    reason: str | None = None


def layout_of(x: Tensor) -> Layout:
    """How ``x``'s matrices are laid out across ranks (see the module docstring)."""
    if not isinstance(x, DTensor):
        return Layout(Kind.LOCAL)
    sharded = [(dim, p) for dim, p in enumerate(x.placements) if not isinstance(p, Replicate)]
    if not sharded:
        return Layout(Kind.LOCAL)
    if len(sharded) > 1:
        return Layout(Kind.DTENSOR, reason=f"placements {x.placements} shard several mesh dimensions")
    mesh_dim, placement = sharded[0]
    if not is_shard(placement):
        return Layout(Kind.DTENSOR, reason=f"placement {placement} is not a plain Shard")
    if placement.dim == 0 and x.dim() == 3:
        return Layout(Kind.LOCAL)
    if placement.dim == 0 and x.dim() == 2:
        size = x.device_mesh.size(mesh_dim)
        if size == 1:
            return Layout(Kind.LOCAL)
        return Layout(Kind.ROWS, x.device_mesh.get_group(mesh_dim).group_name, size)
    return Layout(Kind.DTENSOR, reason=f"Shard({placement.dim}) of a {x.dim()}-D tensor")


def wrap_like(local: Tensor, like: Tensor) -> Tensor:
    """``local`` as a DTensor with ``like``'s mesh, placements, global shape and stride
    (``local`` itself when ``like`` is a plain tensor)."""
    if not isinstance(like, DTensor):
        return local
    return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False, shape=like.shape, stride=like.stride())

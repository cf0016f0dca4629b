"""``muon_compile::sharded_newton_schulz``: Newton–Schulz of a row-sharded matrix.

Schema::

    sharded_newton_schulz(Tensor local, int global_rows, str group_name, int group_size,
                          <NSArgs.SCHEMA>) -> Tensor

Every rank of the process group ``group_name`` calls it with its ``torch.chunk`` row
shard (FSDP2's ``Shard(0)`` layout: ``ceil(rows / W)`` rows per rank, the last shards
shorter or empty) of a ``global_rows x cols`` matrix and gets back its rows of
``newton_schulz`` of the whole matrix. It is one node per parameter in every rank's
graph — also on a rank whose shard is empty — which is what lets the ``distribute``
pass plan identical buckets on every rank. The op is a collective, so it is registered
as side-effecting: dead-code elimination never removes it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from . import config
from .ns_args import AUTO, NSArgs
from .ns_kernel import orthogonalize
from .op_support import check_input, register_no_derivative

_QUALNAME = "muon_compile::sharded_newton_schulz"


@dataclasses.dataclass(frozen=True)
class ShardGroup:
    """A row-sharded matrix's global row count and the process group its rows are spread over."""

    global_rows: int
    group_name: str
    group_size: int


@dataclasses.dataclass(frozen=True)
class RowShard:
    """Where one rank's rows of a ``torch.chunk``-sharded matrix sit."""

    rows_per_shard: int
    start: int
    local_rows: int


def row_shard(global_rows: int, world: int, rank: int) -> RowShard:
    """``torch.chunk`` layout: ``ceil(rows / world)`` rows per rank, the tail short or empty."""
    per = math.ceil(global_rows / world) if global_rows else 0
    start = min(rank * per, global_rows)
    return RowShard(per, start, min(per, global_rows - start))


def group_rank(group_name: str) -> int:
    """This process's rank in the group registered under ``group_name``."""
    group = dist.distributed_c10d._resolve_process_group(group_name)
    return dist.get_rank(group)


def gather_orthogonalize_slice(local: Tensor, group: ShardGroup, rank: int, args: NSArgs, policy: str = AUTO) -> Tensor:
    """The reference algorithm, one collective per matrix (the passes batch it).

    1. Cast the shard to the compute dtype (Newton–Schulz's own first step, so the
       transport is half as wide in bf16 and the result is unchanged) and zero-pad it to
       ``ceil(rows / W)`` rows.
    2. All-gather the padded shards, trim the padding rows.
    3. Orthogonalise the whole matrix (``auto`` resolved under ``policy``); return this rank's rows in the shard's dtype.
    """
    shard = row_shard(group.global_rows, group.group_size, rank)
    padded = F.pad(local.to(args.compute_dtype), (0, 0, 0, shard.rows_per_shard - local.size(0)))
    gathered = torch.ops._c10d_functional.all_gather_into_tensor(padded, group.group_size, group.group_name)
    full = torch.ops._c10d_functional.wait_tensor(gathered)[: group.global_rows]
    ortho = orthogonalize(full, args, policy)
    return ortho[shard.start : shard.start + shard.local_rows].to(local.dtype)


def check_shard(local: Tensor, group: ShardGroup, rank: int) -> None:
    """Raise ``ValueError`` unless ``local`` is this rank's ``torch.chunk`` row shard."""
    if local.dim() != 2:
        raise ValueError(f"sharded_newton_schulz expects a 2-D row shard, got shape {tuple(local.shape)}")
    expected = row_shard(group.global_rows, group.group_size, rank).local_rows
    if local.size(0) != expected:
        raise ValueError(
            f"sharded_newton_schulz: rank {rank} of {group.group_size} holds {local.size(0)} rows of a "
            f"{group.global_rows}-row matrix; torch.chunk sharding gives it {expected}"
        )


torch.library.define(
    _QUALNAME, f"(Tensor local, int global_rows, str group_name, int group_size, {NSArgs.SCHEMA}) -> Tensor"
)


def split_args(args: Sequence[object]) -> tuple[object, ShardGroup, NSArgs]:
    """An op call's arguments as ``(local, ShardGroup, NSArgs)``."""
    return args[0], ShardGroup(*args[1:4]), NSArgs.from_op(args[4:])  # type: ignore[arg-type]


@torch.library.impl(_QUALNAME, "CompositeExplicitAutograd")
def _sharded_impl(local: Tensor, *rest: object) -> Tensor:
    _, group, args = split_args((local, *rest))
    rank = group_rank(group.group_name)
    check_shard(local, group, rank)
    check_input(local)
    out = gather_orthogonalize_slice(local, group, rank, args, config.current().ns_algorithm)
    # a tensor of its own, as the fake implementation says: a rank's rows start inside the
    # whole result (where the dtype already matches) and Inductor, calling this op as a
    # fallback kernel, checks that its output is aligned
    return out.clone() if out.storage_offset() else out


@torch.library.register_fake(_QUALNAME)
def _sharded_fake(local: Tensor, *rest: object) -> Tensor:
    split_args((local, *rest))
    check_input(local)
    return torch.empty_like(local, memory_format=torch.contiguous_format)


register_no_derivative(_QUALNAME)
SHARDED_NEWTON_SCHULZ = torch.ops.muon_compile.sharded_newton_schulz.default
torch.fx.node.has_side_effect(SHARDED_NEWTON_SCHULZ)


def sharded_newton_schulz_op(local: Tensor, group: ShardGroup, args: NSArgs) -> Tensor:
    """Call the op on this rank's row shard ``local`` of a matrix sharded over ``group``."""
    return SHARDED_NEWTON_SCHULZ(local, group.global_rows, group.group_name, group.group_size, *args.to_op())

"""``muon_compile::sharded_newton_schulz``: Newton–Schulz of a matrix sharded over a group of ranks.

Schema::

    sharded_newton_schulz(Tensor local, int rows, int cols, str group_name, int[] mesh,
                          int[] dims, int[] split, str tp_mode, <NSArgs.SCHEMA>) -> Tensor

The ranks of the process group ``group_name`` form a row-major grid of ``mesh`` sizes (the
sharded mesh dimensions of a DTensor, in mesh order; group rank ``g`` has the grid coordinates
of ``g`` unravelled over ``mesh``). Mesh dimension ``i`` shards matrix dimension ``dims[i]``
(0: rows, 1: columns) as DTensor's ``Shard`` (``split[i] == 0``: ``torch.chunk`` pieces, the
tail short or empty) or ``_StridedShard`` with split factor ``split[i]`` (FSDP2 sharding a
tensor-parallel shard again), applied left to right as DTensor applies placements
(:class:`ShardLayout`). So each rank holds a block: some of the rows times some of the
columns. FSDP2 alone is ``mesh=[W], dims=[0], split=[0]``: ``ceil(rows / W)`` rows per rank.
``tp_mode`` (:class:`muon_compile.config.TPMode`'s names) tells the passes how to distribute
it: ``duplicated`` on every rank of the group, otherwise by owner; under ``blockwise`` the
matrix is one tensor-parallel block (:func:`tp_block`).

Every rank of the group calls it with its block of the ``rows x cols`` matrix (or a 3-D stack of
such blocks, one per matrix of a stack laid out alike) and gets back its block of
``newton_schulz`` of the whole matrix. It is one node per parameter in every rank's
graph — also on a rank whose block is empty — which is what lets the ``distribute`` pass plan
identical buckets on every rank. The op is a collective, so it is registered as
side-effecting: dead-code elimination never removes it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from .. import config
from ..ns.args import AUTO, NSArgs
from ..ns.evaluate import orthogonalize
from ..ns.op_support import check_input, register_no_derivative

_QUALNAME = "muon_compile::sharded_newton_schulz"


# indices of rows or columns as contiguous stretches, in local order
Stretches = tuple[range, ...]


def _merged(stretches: Sequence[range]) -> Stretches:
    """``stretches`` with neighbours that continue each other joined, empty ones dropped."""
    out: list[range] = []
    for r in stretches:
        if not r:
            continue
        if out and out[-1].stop == r.start:
            out[-1] = range(out[-1].start, r.stop)
        else:
            out.append(r)
    return tuple(out)


def _length(stretches: Stretches) -> int:
    return sum(len(r) for r in stretches)


def _slice(stretches: Stretches, start: int, stop: int) -> Stretches:
    """Positions ``start`` to ``stop`` of the indices ``stretches`` list."""
    out, pos = [], 0
    for r in stretches:
        lo, hi = max(start - pos, 0), min(stop - pos, len(r))
        if lo < hi:
            out.append(r[lo:hi])
        pos += len(r)
    return _merged(out)


def _chunk(stretches: Stretches, n: int) -> tuple[Stretches, ...]:
    """``torch.chunk`` into ``n`` pieces, filled up with empty ones (DTensor's ``Shard``)."""
    size = math.ceil(_length(stretches) / n)
    return tuple(_slice(stretches, i * size, (i + 1) * size) for i in range(n))


@functools.lru_cache(maxsize=4096)
def _split(stretches: Stretches, n: int, split: int) -> tuple[Stretches, ...]:
    """The ``n`` pieces under ``Shard`` (``split == 0``) or ``_StridedShard`` with split factor
    ``split``: chunked into ``split`` pieces, each chunked into ``n``, piece ``i`` the
    concatenation of every ``i``-th chunk (DTensor's ``_split_tensor`` of each)."""
    if not split:
        return _chunk(stretches, n)
    parts = [_chunk(p, n) for p in _chunk(stretches, split)]
    return tuple(_merged([r for p in parts for r in p[i]]) for i in range(n))


@dataclasses.dataclass(frozen=True)
class Block:
    """One rank's block: the global indices of its rows and of its columns, in local order."""

    rows: Stretches
    cols: Stretches

    @property
    def nrows(self) -> int:
        return _length(self.rows)

    @property
    def ncols(self) -> int:
        return _length(self.cols)


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """A ``rows x cols`` matrix spread over the process group ``group_name`` (see the module
    docstring for ``mesh``, ``dims`` and ``split``)."""

    rows: int
    cols: int
    group_name: str
    mesh: tuple[int, ...]
    dims: tuple[int, ...]
    split: tuple[int, ...]
    tp_mode: str = "distributed"

    @classmethod
    def row_chunks(cls, rows: int, cols: int, group_name: str, group_size: int) -> ShardLayout:
        """FSDP2's layout: ``Shard(0)`` over one mesh dimension of ``group_size`` ranks."""
        return cls(rows, cols, group_name, (group_size,), (0,), (0,))

    @property
    def group_size(self) -> int:
        return math.prod(self.mesh)

    @property
    def is_row_chunks(self) -> bool:
        """Whether rank ``g`` holds rows ``g * rows_per_shard`` onward, every column (FSDP2)."""
        return self.dims == (0,) and self.split == (0,)

    @property
    def concrete(self) -> bool:
        """Whether the sizes are plain ints (not Dynamo's symbols): only then are the blocks known."""
        return isinstance(self.rows, int) and isinstance(self.cols, int)

    def blocks(self) -> tuple[Block, ...]:
        """Every group rank's block, by group rank."""
        return _blocks(self.rows, self.cols, self.mesh, self.dims, self.split)

    def block(self, rank: int) -> Block:
        return self.blocks()[rank]

    @property
    def rows_per_shard(self) -> int:
        """The most rows any rank holds: a block's rows in transport, zero-padded."""
        if self.is_row_chunks:
            return math.ceil(self.rows / self.mesh[0])
        return _transport(self.rows, self.cols, self.mesh, self.dims, self.split)[0]

    @property
    def cols_per_shard(self) -> int:
        """The most columns any rank holds: a block's columns in transport, zero-padded."""
        if self.is_row_chunks:
            return self.cols
        return _transport(self.rows, self.cols, self.mesh, self.dims, self.split)[1]

    def describe(self) -> str:
        """``2x2 (rows, cols:strided 2)``: the grid and what each of its dimensions shards."""
        what = [("rows", "cols")[d] + (f":strided {s}" if s else "") for d, s in zip(self.dims, self.split)]
        mode = "" if self.tp_mode == "distributed" else f", tp {self.tp_mode}"
        return f"{'x'.join(map(str, self.mesh))} ({', '.join(what)}{mode})"


@functools.lru_cache(maxsize=4096)
def _transport(rows: int, cols: int, mesh: tuple[int, ...], dims: tuple[int, ...], split: tuple[int, ...]) -> tuple[int, int]:
    """The most rows and the most columns any rank's block holds."""
    blocks = _blocks(rows, cols, mesh, dims, split)
    return max(b.nrows for b in blocks), max(b.ncols for b in blocks)


@functools.lru_cache(maxsize=4096)
def _blocks(rows: int, cols: int, mesh: tuple[int, ...], dims: tuple[int, ...], split: tuple[int, ...]) -> tuple[Block, ...]:
    out = []
    for coords in itertools.product(*(range(n) for n in mesh)):  # row-major: group rank order
        indices = [_merged([range(rows)]), _merged([range(cols)])]
        for coord, n, dim, factor in zip(coords, mesh, dims, split):
            indices[dim] = _split(indices[dim], n, factor)[coord]
        out.append(Block(*indices))
    return tuple(out)


def tp_block(layout: ShardLayout, tp: Sequence[bool], coords: Sequence[int]) -> ShardLayout | str:
    """Under ``blockwise``, the matrix is this rank's tensor-parallel block: the part of
    ``layout``'s matrix that the ranks sharing this rank's coordinates ``coords`` on the
    tensor-parallel positions (``tp[i]``: mesh position ``i`` is tensor-parallel) hold between
    them. Returns that block as a layout over the other positions (empty ``mesh`` when there
    are none: the block is this rank's own), or why it is not one contiguous block.

    The block is cut by the tensor-parallel ``Shard`` placements alone; each other position
    shards it as it shards the whole matrix, except FSDP2's ``_StridedShard`` over a
    tensor-parallel shard of the same dimension, which becomes a plain ``Shard`` of the block.
    The result is checked rank by rank against ``layout``'s own blocks."""
    extent = [range(layout.rows), range(layout.cols)]
    for i, (n, dim, factor) in enumerate(zip(layout.mesh, layout.dims, layout.split)):
        if tp[i]:
            if factor:
                return f"its tensor-parallel placement at mesh position {i} is strided"
            part = _chunk((extent[dim],), n)[coords[i]]
            extent[dim] = part[0] if part else range(extent[dim].start, extent[dim].start)
    keep = [i for i in range(len(layout.mesh)) if not tp[i]]

    def tp_after(i: int) -> int:
        return math.prod(layout.mesh[j] for j in range(i + 1, len(layout.mesh)) if tp[j] and layout.dims[j] == layout.dims[i])

    split = tuple(0 if layout.split[i] and layout.split[i] == tp_after(i) else layout.split[i] for i in keep)
    sub = ShardLayout(
        len(extent[0]), len(extent[1]), "",
        tuple(layout.mesh[i] for i in keep), tuple(layout.dims[i] for i in keep), split, config.TPMode.BLOCKWISE.value,
    )
    for sub_coords in itertools.product(*(range(layout.mesh[i]) for i in keep)):
        full = list(coords)
        for i, c in zip(keep, sub_coords):
            full[i] = c
        want = layout.block(_ravel(full, layout.mesh))
        got = sub.block(_ravel(sub_coords, sub.mesh)) if keep else Block((range(len(extent[0])),), (range(len(extent[1])),))
        shifted = Block(_shift(got.rows, extent[0].start), _shift(got.cols, extent[1].start))
        if shifted != Block(_merged(want.rows), _merged(want.cols)):
            return f"placements {layout.describe()}: a tensor-parallel block is not one contiguous block of rows and columns"
    return sub


def _ravel(coords: Sequence[int], mesh: Sequence[int]) -> int:
    """The row-major index of ``coords`` in a grid of ``mesh`` sizes."""
    index = 0
    for c, n in zip(coords, mesh):
        index = index * n + c
    return index


def _shift(stretches: Stretches, by: int) -> Stretches:
    return _merged([range(r.start + by, r.stop + by) for r in stretches])


def _runs(stretches: Stretches) -> list[tuple[int, int, int]]:
    """``(global start, local start, length)`` of each stretch."""
    out, local = [], 0
    for r in stretches:
        out.append((r.start, local, len(r)))
        local += len(r)
    return out


def _cat(parts: list[Tensor], dim: int, empty: Tensor) -> Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim) if parts else empty


def _take(whole: Tensor, block: Block) -> Tensor:
    """``block`` of ``whole`` (``[..., rows, cols]``): slices of its contiguous stretches, joined."""
    rows = _cat([whole[..., r : r + n, :] for r, _, n in _runs(block.rows)], -2, whole[..., :0, :])
    return _cat([rows[..., c : c + n] for c, _, n in _runs(block.cols)], -1, rows[..., :0])


def assemble(grid: Tensor, layout: ShardLayout) -> Tensor:
    """Every rank's padded block, ``[G, n, rows_per_shard, cols_per_shard]`` -> the ``n``
    whole ``[n, rows, cols]`` matrices (padding dropped).

    FSDP2's row chunks: one permute and reshape. Other layouts: each rank's block is a few
    contiguous stretches of rows times a few of columns (one of each for plain ``Shard``
    placements, one per split for ``_StridedShard``); their pieces are joined by column within
    each band of rows, and the bands by row (slices and concatenations, which Inductor writes
    as one copy kernel; no index tensor). All ranks that hold a band of rows hold the same
    rows, so the pieces of a band have one height."""
    world, n = grid.size(0), grid.size(1)
    if layout.is_row_chunks:
        return grid.permute(1, 0, 2, 3).reshape(n, world * layout.rows_per_shard, layout.cols)[:, : layout.rows]
    bands: dict[int, list[tuple[int, Tensor]]] = {}
    for g, block in enumerate(layout.blocks()):
        for r, lr, nr in _runs(block.rows):
            for c, lc, nc in _runs(block.cols):
                bands.setdefault(r, []).append((c, grid[g, :, lr : lr + nr, lc : lc + nc]))
    rows = [_cat([t for _, t in sorted(band, key=lambda p: p[0])], -1, grid[0, :, :0]) for _, band in sorted(bands.items())]
    return _cat(rows, -2, grid[0, :, :0])


def disassemble(whole: Tensor, layout: ShardLayout) -> Tensor:
    """The mirror of :func:`assemble`: ``[n, rows, cols]`` -> every rank's block, zero-padded,
    ``[G, n, rows_per_shard, cols_per_shard]``."""
    n, world, rps, cps = whole.size(0), layout.group_size, layout.rows_per_shard, layout.cols_per_shard
    if layout.is_row_chunks:
        return pad(whole, world * rps, layout.cols).view(n, world, rps, layout.cols).permute(1, 0, 2, 3)
    return torch.stack([pad(_take(whole, block), rps, cps) for block in layout.blocks()])


def own_block(whole: Tensor, layout: ShardLayout, rank: int) -> Tensor:
    """Rank ``rank``'s block of the matrix ``whole``, unpadded."""
    block = layout.block(rank)
    if layout.is_row_chunks:
        start = min(rank * layout.rows_per_shard, layout.rows)
        return whole[..., start : start + block.nrows, :]
    return _take(whole, block)


def pad(t: Tensor, rows: int, cols: int) -> Tensor:
    """``t`` (a matrix or a stack of them) zero-padded to ``rows x cols``."""
    return t if t.shape[-2:] == (rows, cols) else F.pad(t, (0, cols - t.size(-1), 0, rows - t.size(-2)))


def pad_block(t: Tensor, layout: ShardLayout) -> Tensor:
    """A rank's block zero-padded to the transport size ``rows_per_shard x cols_per_shard``."""
    return pad(t, layout.rows_per_shard, layout.cols_per_shard)


def group_rank(group_name: str) -> int:
    """This process's rank in the group registered under ``group_name``."""
    group = dist.distributed_c10d._resolve_process_group(group_name)
    return dist.get_rank(group)


def gather_orthogonalize_slice(
    local: Tensor,
    layout: ShardLayout,
    rank: int,
    args: NSArgs,
    policy: str = AUTO,
    products: str = AUTO,
    epilogue: str = AUTO,
    orientation: str = AUTO,
) -> Tensor:
    """The reference algorithm, one collective per matrix (the passes batch it).

    1. Cast the block to the compute dtype (Newton–Schulz's own first step, so the
       transport is half as wide in bf16 and the result is unchanged) and zero-pad it to
       ``rows_per_shard x cols_per_shard``.
    2. All-gather the padded blocks and reassemble the whole matrix (:func:`assemble`).
    3. Orthogonalise it (``auto`` resolved under ``policy``, symmetric products as
       ``products`` says (a policy: as the device's table says), the textbook scalars where ``epilogue`` says, a tall matrix's
       iterates laid out as ``orientation`` says:
       :func:`muon_compile.ns.evaluate.orthogonalize`); return this rank's block in the
       input's dtype.
    """
    padded = pad_block(local.to(args.compute_dtype), layout)
    gathered = torch.ops._c10d_functional.all_gather_into_tensor(padded, layout.group_size, layout.group_name)
    grid = torch.ops._c10d_functional.wait_tensor(gathered).view(layout.group_size, -1, *padded.shape[-2:])
    ortho = orthogonalize(assemble(grid, layout), args, policy, products, epilogue, orientation=orientation)  # [n, rows, cols]
    return own_block(ortho, layout, rank).reshape(local.shape).to(local.dtype)


def check_shard(local: Tensor, layout: ShardLayout, rank: int) -> None:
    """Raise ``ValueError`` unless ``local`` has the shape of this rank's block."""
    if local.dim() not in (2, 3):
        raise ValueError(f"sharded_newton_schulz expects a 2-D block or a 3-D stack of blocks, got shape {tuple(local.shape)}")
    block = layout.block(rank)
    if tuple(local.shape[-2:]) != (block.nrows, block.ncols):
        raise ValueError(
            f"sharded_newton_schulz: rank {rank} of {layout.group_size} holds a {tuple(local.shape[-2:])} block of a "
            f"{layout.rows}x{layout.cols} matrix laid out {layout.describe()}; that layout gives it "
            f"{(block.nrows, block.ncols)}"
        )


def check_layout(layout: ShardLayout) -> None:
    """Raise ``ValueError`` for a layout the op does not define."""
    if not (len(layout.mesh) == len(layout.dims) == len(layout.split)) or not layout.mesh:
        raise ValueError(f"sharded_newton_schulz: mesh {layout.mesh}, dims {layout.dims} and split {layout.split} must be non-empty and of one length")
    if any(d not in (0, 1) for d in layout.dims) or any(n < 1 for n in layout.mesh) or any(s < 0 for s in layout.split):
        raise ValueError(f"sharded_newton_schulz: dims must be 0 or 1, mesh sizes >= 1 and split factors >= 0; got {layout}")
    config.TPMode.check(layout.tp_mode, "sharded_newton_schulz: tp_mode")


torch.library.define(
    _QUALNAME,
    f"(Tensor local, int rows, int cols, str group_name, int[] mesh, int[] dims, int[] split, str tp_mode, {NSArgs.SCHEMA}) -> Tensor",
)


def split_args(args: Sequence[object]) -> tuple[object, ShardLayout, NSArgs]:
    """An op call's arguments as ``(local, ShardLayout, NSArgs)``."""
    rows, cols, group_name, mesh, dims, split, tp_mode = args[1:8]
    layout = ShardLayout(rows, cols, group_name, tuple(mesh), tuple(dims), tuple(split), tp_mode)  # type: ignore[arg-type]
    return args[0], layout, NSArgs.from_op(args[8:])


@torch.library.impl(_QUALNAME, "CompositeExplicitAutograd")
def _sharded_impl(local: Tensor, *rest: object) -> Tensor:
    _, layout, args = split_args((local, *rest))
    check_layout(layout)
    rank = group_rank(layout.group_name)
    check_shard(local, layout, rank)
    check_input(local)
    cfg = config.current()
    out = gather_orthogonalize_slice(local, layout, rank, args, cfg.ns_algorithm, epilogue=cfg.ns_epilogue, orientation=cfg.ns_orientation)
    # a tensor of its own, as the fake implementation says: a rank's rows start inside the
    # whole result (where the dtype already matches) and Inductor, calling this op as a
    # fallback kernel, checks that its output is aligned
    return out.clone() if out.storage_offset() else out


@torch.library.register_fake(_QUALNAME)
def _sharded_fake(local: Tensor, *rest: object) -> Tensor:
    _, layout, _ = split_args((local, *rest))
    check_layout(layout)
    check_input(local)
    return torch.empty_like(local, memory_format=torch.contiguous_format)


register_no_derivative(_QUALNAME)
SHARDED_NEWTON_SCHULZ = torch.ops.muon_compile.sharded_newton_schulz.default
torch.fx.node.has_side_effect(SHARDED_NEWTON_SCHULZ)


def sharded_newton_schulz_op(local: Tensor, layout: ShardLayout, args: NSArgs) -> Tensor:
    """Call the op on this rank's block ``local`` of a matrix laid out as ``layout``."""
    return SHARDED_NEWTON_SCHULZ(
        local,
        layout.rows,
        layout.cols,
        layout.group_name,
        list(layout.mesh),
        list(layout.dims),
        list(layout.split),
        layout.tp_mode,
        *args.to_op(),
    )

"""Where each rank's block of a sharded matrix sits (:class:`muon_compile.distributed.sharded_op.ShardLayout`):
the same as DTensor's own sharding, for every layout of ``Shard`` / ``_StridedShard`` placements
over one or two mesh dimensions (tensor parallelism, FSDP2 on top of it, HSDP on top of it);
whole matrices reassembled from the blocks and cut back into them exactly."""

import itertools

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from muon_compile.distributed import routing
from muon_compile.distributed.sharded_op import (
    ShardLayout,
    _split,
    assemble,
    disassemble,
    group_rank,
    own_block,
    pad_block,
)


def indices(stretches):
    return [i for r in stretches for i in r]

from dist_harness import fake_rank


@pytest.mark.parametrize("factor", [0, 2, 3])
def test_split_is_dtensors_own(factor):
    """Every size 0-13 over 1-4 ranks: the indices DTensor's ``_split_tensor`` gives each rank."""
    placement = _StridedShard(0, split_factor=factor) if factor else Shard(0)
    for size, n in itertools.product(range(14), range(1, 5)):
        pieces, _ = placement._split_tensor(torch.arange(size), n, with_padding=False)
        assert [p.tolist() for p in pieces] == [indices(p) for p in _split((range(size),), n, factor)], (size, n)


LAYOUTS = {
    "fsdp rows, 3 ranks": ((3,), (0,), (0,)),
    "tp columns, 3 ranks": ((3,), (1,), (0,)),
    "rows x columns, 2x2": ((2, 2), (0, 1), (0,)*2),
    "columns x rows, 2x3": ((2, 3), (1, 0), (0, 0)),
    "fsdp on tp rows, 2x2": ((2, 2), (0, 0), (2, 0)),
    "fsdp on tp rows, 3x2": ((3, 2), (0, 0), (2, 0)),
    "fsdp rows on tp columns, 2x2": ((2, 2), (0, 1), (0, 0)),
}
SHAPES = [(7, 5), (12, 8), (1, 3), (5, 1)]


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_blocks_tile_the_matrix_and_round_trip(name, shape):
    mesh, dims, split = LAYOUTS[name]
    layout = ShardLayout(*shape, "g", mesh, dims, split)
    whole = torch.randn(3, *shape)
    seen = torch.zeros(shape, dtype=torch.int64)
    for block in layout.blocks():
        for r, c in itertools.product(indices(block.rows), indices(block.cols)):
            seen[r, c] += 1
    assert (seen == 1).all(), "every element in exactly one block"
    grid = disassemble(whole, layout)
    assert grid.shape == (layout.group_size, 3, layout.rows_per_shard, layout.cols_per_shard)
    for rank, block in enumerate(layout.blocks()):
        want = whole[:, indices(block.rows)][:, :, indices(block.cols)]
        assert torch.equal(grid[rank, :, : block.nrows, : block.ncols], want)
        assert torch.equal(own_block(whole[1], layout, rank), want[1])
        padded = pad_block(want[1], layout)
        assert padded.shape == (layout.rows_per_shard, layout.cols_per_shard) and torch.equal(padded[: want.size(1), : want.size(2)], want[1])
    # the padding of each block is zero in transport (pad_block), whatever disassemble left there
    blocks = torch.stack([pad_block(grid[r, :, : b.nrows, : b.ncols], layout) for r, b in enumerate(layout.blocks())])
    assert torch.equal(assemble(blocks, layout), whole)
    assert torch.equal(assemble(grid, layout), whole)


def _dtensor_blocks(rank, world, mesh_shape, placements, shape):
    """On fake rank ``rank``: DTensor's local tensor of a ``shape`` matrix (chunked here, no
    communication) and the block the routing's layout gives this rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    whole = torch.arange(shape[0] * shape[1], dtype=torch.float32).view(shape)
    mesh = init_device_mesh("cpu", mesh_shape)
    x = distribute_tensor(whole, mesh, placements, src_data_rank=None)
    routing.prepare(x)
    layout = routing.layout_of(x)
    assert layout.kind is routing.Kind.SHARDED, layout.reason
    block = layout.shard.block(group_rank(layout.shard.group_name))
    return x.to_local(), whole[indices(block.rows)][:, indices(block.cols)], layout.shard


PLACEMENTS = {
    "tp Shard(1)": ((4,), [Shard(1)]),
    "dp x tp: Shard(0), Shard(1)": ((2, 2), [Shard(0), Shard(1)]),
    "dp x tp: Shard(1), Shard(0)": ((2, 2), [Shard(1), Shard(0)]),
    "fsdp on tp rows: _StridedShard(0, 2), Shard(0)": ((2, 2), [_StridedShard(0, split_factor=2), Shard(0)]),
    "hsdp x tp: Replicate, Shard(0), Shard(1)": ((1, 2, 2), [Replicate(), Shard(0), Shard(1)]),
    "replicate x tp: Replicate, Shard(1)": ((2, 2), [Replicate(), Shard(1)]),
}


@pytest.mark.parametrize("name", PLACEMENTS)
@pytest.mark.parametrize("shape", [(7, 5), (16, 12), (3, 2)], ids=str)
def test_the_routing_layout_is_dtensors_sharding(name, shape):
    """For each rank of a fake world of 4: the routing's block of the matrix is DTensor's
    local tensor (uneven sizes, an empty block where a dimension is shorter than its mesh)."""
    mesh_shape, placements = PLACEMENTS[name]
    for rank in range(4):
        local, mine, layout = fake_rank(_dtensor_blocks, 4, rank, mesh_shape, placements, shape)
        assert torch.equal(local, mine), (rank, layout)


def _blockwise(rank, world, mesh_shape, names, placements, shape):
    """On fake rank ``rank``, under the ``blockwise`` mode: the routing's layout, this rank's
    tensor-parallel block as DTensor defines it (the other placements made ``Replicate``),
    the part of that block the layout gives this rank, and DTensor's local tensor."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    whole = torch.arange(shape[0] * shape[1], dtype=torch.float32).view(shape)
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    x = distribute_tensor(whole, mesh, placements, src_data_rank=None)
    only_tp = [p if n == "tp" else Replicate() for n, p in zip(names, placements)]
    tp_block = distribute_tensor(whole, mesh, only_tp, src_data_rank=None).to_local()
    routing.prepare(x, "blockwise")
    layout = routing.layout_of(x, "blockwise")
    mine = None
    if layout.kind is routing.Kind.SHARDED:
        block = layout.shard.block(group_rank(layout.shard.group_name))
        mine = tp_block[indices(block.rows)][:, indices(block.cols)]
    return layout, tp_block, mine, x.to_local()


BLOCKWISE = {
    "tp Shard(0)": ((4,), ("tp",), [Shard(0)], routing.Kind.LOCAL),
    "replicate x tp: Replicate, Shard(1)": ((2, 2), ("dp", "tp"), [Replicate(), Shard(1)], routing.Kind.LOCAL),
    "fsdp x tp: Shard(0), Shard(1)": ((2, 2), ("dp", "tp"), [Shard(0), Shard(1)], routing.Kind.SHARDED),
    "fsdp on tp rows: _StridedShard(0, 2), Shard(0)": ((2, 2), ("dp", "tp"), [_StridedShard(0, split_factor=2), Shard(0)], routing.Kind.SHARDED),
    "tp x fsdp: Shard(0), Shard(0)": ((2, 2), ("tp", "dp"), [Shard(0), Shard(0)], routing.Kind.SHARDED),
    "hsdp x tp: Replicate, Shard(0), Shard(1)": ((1, 2, 2), ("rep", "dp", "tp"), [Replicate(), Shard(0), Shard(1)], routing.Kind.SHARDED),
}


@pytest.mark.parametrize("name", BLOCKWISE)
@pytest.mark.parametrize("shape", [(7, 5), (16, 12), (3, 2)], ids=str)
def test_blockwise_orthogonalises_dtensors_tensor_parallel_block(name, shape):
    """``blockwise``: the matrix each rank takes part in is its tensor-parallel block as DTensor
    cuts it; with no other sharded mesh dimension it is this rank's own (no communication),
    otherwise the layout over the other dimensions gives each rank DTensor's local tensor."""
    mesh_shape, names, placements, kind = BLOCKWISE[name]
    for rank in range(4):
        layout, tp_block, mine, local = fake_rank(_blockwise, 4, rank, mesh_shape, names, placements, shape)
        assert layout.kind is kind, (rank, layout)
        if kind is routing.Kind.LOCAL:
            assert torch.equal(local, tp_block)
        else:
            assert layout.shard.tp_mode == "blockwise" and (layout.shard.rows, layout.shard.cols) == tuple(tp_block.shape)
            assert torch.equal(mine, local), (rank, layout.shard)


def test_blockwise_of_a_block_that_is_not_contiguous_is_distributed_with_its_reason():
    """``Shard(0)`` on the data-parallel dimension before ``Shard(0)`` on the tensor-parallel
    one (not FSDP2's strided layout): a tensor-parallel block is rows from every data-parallel
    chunk, so the matrix is distributed whole, and the reason says why."""
    layout, *_ = fake_rank(_blockwise, 4, 1, (2, 2), ("dp", "tp"), [Shard(0), Shard(0)], (8, 3))
    assert layout.kind is routing.Kind.SHARDED and layout.shard.tp_mode == "distributed"
    assert "not one contiguous block" in layout.reason and "distributed by owner instead" in layout.reason


@pytest.mark.parametrize("mode", ["distributed", "duplicated"])
def test_whole_matrix_modes_keep_the_layout_and_name_the_mode(mode):
    layout, *_ = fake_rank(_blockwise, 4, 2, (2, 2), ("dp", "tp"), [Shard(0), Shard(1)], (7, 5))
    distributed = fake_rank(_layout_under, 4, 2, mode)
    assert distributed.kind is routing.Kind.SHARDED and distributed.shard.tp_mode == mode
    assert (distributed.shard.rows, distributed.shard.cols, distributed.shard.mesh) == (7, 5, (2, 2))
    assert layout.shard.mesh == (2,)  # blockwise: over dp alone


def _layout_under(rank, world, mode):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    x = distribute_tensor(torch.zeros(7, 5), mesh, [Shard(0), Shard(1)], src_data_rank=None)
    routing.prepare(x, mode)
    return routing.layout_of(x, mode)


def _stack_blocks(rank, world, placements, shape):
    """On fake rank ``rank`` of a 2x2 (ep, tp) mesh: DTensor's local tensor of a 3-D stack and
    the same cut by the routing: the experts DTensor gives this rank, each matrix's block."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    whole = torch.arange(shape[0] * shape[1] * shape[2], dtype=torch.float32).view(shape)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ep", "tp"))
    x = distribute_tensor(whole, mesh, placements, src_data_rank=None)
    experts = [p if p.dim == 0 else Replicate() for p in placements]
    mine = distribute_tensor(whole, mesh, experts, src_data_rank=None).to_local()
    routing.prepare(x)
    layout = routing.layout_of(x)
    assert layout.kind is routing.Kind.SHARDED, layout.reason
    block = layout.shard.block(group_rank(layout.shard.group_name))
    return x.to_local(), mine[:, indices(block.rows)][:, :, indices(block.cols)], layout.shard


@pytest.mark.parametrize("placements", [[Shard(0), Shard(1)], [Shard(0), Shard(2)], [Shard(2), Shard(0)]], ids=str)
@pytest.mark.parametrize("shape", [(4, 12, 10), (3, 5, 7)], ids=str)
def test_a_stack_sharded_on_a_matrix_dimension_is_laid_out_per_matrix(placements, shape):
    """A 3-D expert stack sharded on the expert dimension and on a matrix dimension: the group
    is the matrix dimension's mesh dimension alone, and each matrix of the local stack is
    its block (uneven experts, rows and columns)."""
    for rank in range(4):
        local, mine, layout = fake_rank(_stack_blocks, 4, rank, placements, shape)
        assert layout.mesh == (2,) and (layout.rows, layout.cols) == shape[1:]
        assert torch.equal(local, mine), (rank, layout)

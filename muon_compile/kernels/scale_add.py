"""The stacked step's write into its members in one Triton launch:
``dsts[i] = dsts[i] * scale + alpha * src[i]`` for every member ``i``.

A stack's parameters are separate tensors at addresses of their own, so no generated kernel
reaches them all; this kernel reads their addresses from a device table (one entry per
member, :func:`address_table`) and updates each in 2-D tiles, reading ``src`` (the stacked
Newton–Schulz result in any float dtype and strides: the bf16 result itself, transposed, or
a slice of a bucket) once. One pass: ``src`` read, each parameter read and written. Without
it, a pass scales ``src`` into an fp32 copy and ``torch._foreach_mul_`` and
``torch._foreach_add_`` make two passes over the parameters: 16 bytes more per fp32
parameter, and three launches or more per stack instead of one.

The arithmetic is that of ``add_`` with ``alpha``, as ``torch.optim.Muon``'s per-parameter
step writes it (``p.mul_(decay)``, then ``p.add_(update, alpha=-lr)``): ``p * scale`` rounded
to the parameters' dtype, then ``alpha * src`` added to it in fp32 with one rounding (a fused
multiply-add). An update the step scales in its own dtype first (Keller's ``u *= scale`` in bf16)
is scaled and rounded so in the kernel (``src_scale``). Cautious weight decay takes the same pass: ``scale`` where ``src * p >= 0``
(in fp32), 1 elsewhere. ``scale`` and ``alpha`` are 0-D tensors: read by the kernel when on the
device (a captured CUDA graph reads their values of each replay), passed as values when on
the host.

:func:`launch` returns False where the kernel does not apply (no Triton on the device, a
dtype or layout it does not take, a table that cannot be made while a CUDA graph is being
captured), and the caller writes the update its own way.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import torch
from torch import Tensor

from .triton_support import bf16_rounded, interpreted, on, tl, triton, triton_usable

DST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SRC_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TILE_ROWS, TILE_COLS = 32, 64  # not tuned on a GPU yet (issue 59's figures are owed)
TABLES_KEPT = 1024  # address tables of the most recent stacks (a step writes one per stack)
_tables: collections.OrderedDict[tuple, Tensor] = collections.OrderedDict()


if triton is not None:
    _TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}

    @triton.jit
    def _rounded(x, DST: tl.constexpr, BF16_INTERPRETED: tl.constexpr):
        """fp32 ``x`` in dtype ``DST``, to nearest even also under the interpreter."""
        if BF16_INTERPRETED:
            x = bf16_rounded(x)
        return x.to(DST)

    @triton.jit
    def _scale_add_kernel(
        table_ptr, src_ptr, scale_ptr, alpha_ptr, scale_value, alpha_value, src_scale, M, N, col_tiles, tiles,
        stride_sb, stride_sm, stride_sn,
        DST: tl.constexpr, SRC: tl.constexpr, TILE_M: tl.constexpr, TILE_N: tl.constexpr, ON_DEVICE: tl.constexpr,
        CAUTIOUS: tl.constexpr, SRC_SCALED: tl.constexpr, BF16_INTERPRETED: tl.constexpr,
        SRC_BF16_INTERPRETED: tl.constexpr, ALIGNED: tl.constexpr,
    ):
        """Tile ``pid % tiles`` (row-major, ``col_tiles`` to a row) of member ``pid // tiles``,
        whose contiguous ``M x N`` tensor of dtype ``DST`` is at address ``table[member]``.
        ``CAUTIOUS``: the factor ``scale`` applies where ``src * dst >= 0`` only;
        ``SRC_SCALED``: ``src`` is first multiplied by ``src_scale`` in its dtype ``SRC``."""
        pid = tl.program_id(0)
        member = (pid // tiles).to(tl.int64)  # member * stride_sb may pass 2^31
        tile = pid % tiles
        dst_ptr = tl.load(table_ptr + member).to(tl.pointer_type(DST))
        if ALIGNED:  # every member at a multiple of 16 bytes (the launcher checked)
            dst_ptr = tl.multiple_of(dst_ptr, 16)
        rows = (tile // col_tiles) * TILE_M + tl.arange(0, TILE_M)
        cols = (tile % col_tiles) * TILE_N + tl.arange(0, TILE_N)
        inside = (rows[:, None] < M) & (cols[None, :] < N)
        if ON_DEVICE:
            scale = tl.load(scale_ptr).to(tl.float32)
            alpha = tl.load(alpha_ptr).to(tl.float32)
        else:
            scale = scale_value
            alpha = alpha_value
        src = tl.load(src_ptr + member * stride_sb + rows[:, None] * stride_sm + cols[None, :] * stride_sn, mask=inside)
        dst = dst_ptr + rows[:, None] * N + cols[None, :]
        update = src.to(tl.float32)
        if SRC_SCALED:  # src * src_scale, rounded to src's dtype as that product is
            scaled = (update * src_scale).to(tl.float32)  # src_scale fp32-exact: one rounding, as a GPU's
            update = _rounded(scaled, SRC, SRC_BF16_INTERPRETED).to(tl.float32)
        param = tl.load(dst, mask=inside).to(tl.float32)
        if CAUTIOUS:
            scale = tl.where(update * param >= 0, scale, 1.0)
        decayed = _rounded(param * scale, DST, BF16_INTERPRETED).to(tl.float32)
        tl.store(dst, _rounded(tl.fma(update, alpha, decayed), DST, BF16_INTERPRETED), mask=inside)


def _fp32(value: float) -> float:
    """``value`` rounded to fp32, as the product by a Python number in a tensor's dtype takes it."""
    return torch.tensor(value, dtype=torch.float32).item()


def takes(device: torch.device, dst_dtype: torch.dtype, src_dtype: torch.dtype) -> bool:
    """Whether the kernel runs on ``device`` for members of ``dst_dtype`` and an update of
    ``src_dtype`` (Triton there, both dtypes supported)."""
    return dst_dtype in DST_DTYPES and src_dtype in SRC_DTYPES and triton_usable(device)


def applies(dsts: Sequence[Tensor], src: Tensor) -> bool:
    """Whether the kernel takes these operands: contiguous ``dsts`` of one supported dtype on
    ``src``'s device, where Triton runs, each of ``src[i]``'s shape; ``src`` 3-D, any strides."""
    if not dsts or src.dim() != 3 or src.shape[0] != len(dsts):
        return False
    first = dsts[0]
    if not takes(src.device, first.dtype, src.dtype):
        return False
    shape = tuple(src.shape[1:])
    return all(
        d.dtype == first.dtype and d.device == src.device and tuple(d.shape) == shape and d.is_contiguous() for d in dsts
    )


def address_table(dsts: Sequence[Tensor]) -> Tensor | None:
    """The members' addresses as an int64 tensor on their device, kept for the most recent
    ``TABLES_KEPT`` address lists (a step reuses its stacks' tables: no copy to the device);
    None if it is new while a CUDA graph is being captured (no copy can be made then).
    A table holds only the addresses it is looked up by, so it is never stale."""
    device = dsts[0].device
    key = (device, tuple(d.data_ptr() for d in dsts))
    table = _tables.get(key)
    if table is not None:
        _tables.move_to_end(key)
        return table
    if capturing(device):
        return None
    table = torch.tensor(key[1], dtype=torch.int64, device=device)
    _tables[key] = table
    while len(_tables) > TABLES_KEPT:
        _tables.popitem(last=False)
    return table


def capturing(device: torch.device) -> bool:
    """Whether a CUDA graph is being captured on ``device``'s current stream."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def launch(
    dsts: Sequence[Tensor],
    scale: Tensor,
    src: Tensor,
    alpha: Tensor,
    cautious: bool = False,
    host_scalars: bool | None = None,
    src_scale: float = 1.0,
) -> bool:
    """``dsts[i] = dsts[i] * scale + alpha * src[i]`` for every ``i`` in one launch (see the
    module docstring; ``cautious`` and ``src_scale``: :func:`muon_compile.optim.stacks.unstack_scale_add_`'s);
    False, with nothing written, where the kernel does not apply.
    ``host_scalars``: pass ``scale`` and ``alpha`` as values (the default where they are on
    the host and ``src`` is not; the tests force it on the CPU)."""
    if not applies(dsts, src):
        return False
    members, rows, cols = src.shape
    if rows == 0 or cols == 0:
        return True
    table = address_table(dsts)
    if table is None:
        return False
    on_device = scale.device == src.device and alpha.device == src.device
    if host_scalars is None:
        host_scalars = not on_device
    if host_scalars and (scale.device.type != "cpu" or alpha.device.type != "cpu"):
        return False
    if not host_scalars and not on_device:
        raise ValueError(f"scale and alpha on {scale.device} and {alpha.device}, the update on {src.device}")
    scale_value, alpha_value = (float(scale), float(alpha)) if host_scalars else (1.0, 1.0)
    scale_ptr, alpha_ptr = (src, src) if host_scalars else (scale, alpha)  # a pointer is passed either way
    col_tiles = triton.cdiv(cols, TILE_COLS)
    tiles = triton.cdiv(rows, TILE_ROWS) * col_tiles
    with on(src.device):
        _scale_add_kernel[(members * tiles,)](
            table, src, scale_ptr, alpha_ptr, scale_value, alpha_value, _fp32(src_scale), rows, cols, col_tiles, tiles,
            src.stride(0), src.stride(1), src.stride(2),
            DST=_TL_DTYPES[dsts[0].dtype], SRC=_TL_DTYPES[src.dtype], TILE_M=TILE_ROWS, TILE_N=TILE_COLS,
            ON_DEVICE=not host_scalars, CAUTIOUS=cautious, SRC_SCALED=src_scale != 1.0,
            BF16_INTERPRETED=dsts[0].dtype == torch.bfloat16 and interpreted(),
            SRC_BF16_INTERPRETED=src.dtype == torch.bfloat16 and interpreted(),
            ALIGNED=all(d.data_ptr() % 16 == 0 for d in dsts),  # vector loads and stores of the members
        )
    return True

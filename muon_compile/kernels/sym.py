"""``muon_compile::sym_bmm``: a batched product whose result is symmetric, computed one
triangle at a time.

``sym_bmm(a, b)`` is ``torch.bmm(a, b)`` for ``a`` ``[B, m, k]`` and ``b`` ``[B, k, m]`` whose
product the caller knows to be symmetric: a Gram matrix ``X Xᵀ`` (``b = a.mT``, any strides)
or the square of a symmetric matrix ``S S`` (``b = a``). ``sym_bmm(a, b, input, beta, alpha)``
is ``torch.baddbmm(input, a, b, beta=beta, alpha=alpha)`` for a symmetric ``input``
``[B, m, m]`` (the textbook iteration's ``B = b A + c A A``): the sum is taken in fp32 before
the one rounding, as cuBLAS's epilogue does. The Triton kernel launches one
program per output tile on and above the diagonal (``T(T+1)/2`` of ``T x T``: about half the
FLOPs for large ``m``), accumulates each in fp32, rounds it once to the output dtype and
writes it twice, as itself and mirrored below the diagonal; a diagonal tile keeps its upper
half and writes that mirrored over its lower half. Every element below the diagonal is so
stored from the value stored above it, and the result is exactly symmetric by construction,
whatever the ``dot`` underneath rounds (``bmm``'s is symmetric to its rounding only; so is one
``dot`` of a diagonal tile: numpy's, under Triton's interpreter with OpenBLAS's Haswell
kernels, rounds its mirrored entries apart). Written for this project after reading the
published designs (Megatron's Triton SYRK, Dion's and flash-muon's kernels, QuACK's
symmetric GEMM); their code is not used.

* The op is a ``torch.library.triton_op``: Inductor compiles the kernel into the generated
  code of a step that calls it (a user-defined Triton kernel), and the fake implementation
  is the op's function traced with fake tensors.
* bf16 and fp16 only; any other dtype, a device without Triton, or a CPU (where nothing
  here is faster than ``bmm``) runs ``torch.bmm``, but for the CPU under Triton's
  interpreter in eager code (:func:`triton_usable`).
* :func:`launch` runs the kernel on any tensors Triton accepts, also on the CPU under
  Triton's interpreter (``TRITON_INTERPRET=1`` in the environment before Triton is imported),
  which is how the tests check it without a GPU.

Equal to ``bmm`` to the accumulation order's rounding: both sum the same products in fp32
and round once, in another order (``tests/kernels/test_sym_kernel.py`` states the bound).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from .triton_support import bf16_rounded, interpreted, on, tl, triton, triton_usable

DTYPES = (torch.bfloat16, torch.float16)
MAX_BATCH_PER_LAUNCH = 65535  # CUDA's limit on a grid's second dimension: larger batches launch in parts
_QUALNAME = "muon_compile::sym_bmm"


@dataclasses.dataclass(frozen=True)
class Tiles:
    """The kernel's launch shape: ``tile x tile`` output tiles, ``tile_k`` of the inner
    dimension per step, and Triton's ``num_warps`` / ``num_stages``."""

    tile: int
    tile_k: int
    num_warps: int = 4
    num_stages: int = 2


def tiles_for(m: int, k: int) -> Tiles:
    """The launch shape for an ``m x m`` result over an inner dimension ``k``: tiles no
    larger than the matrix needs (``tl.dot`` takes 16 and up), 128 from 512 rows on.
    Not tuned on a GPU yet (the issue's figures are owed)."""
    tile = 16 if m <= 16 else 32 if m <= 32 else 64 if m < 512 else 128
    tile_k = 16 if k <= 16 else 32 if k <= 32 else 64
    return Tiles(tile, tile_k, num_warps=8 if tile == 128 else 4, num_stages=3 if tile == 128 else 2)


def check_operands(a: Tensor, b: Tensor, input: Tensor | None = None) -> None:  # noqa: A002
    """``ValueError`` unless ``a`` is ``[B, m, k]``, ``b`` ``[B, k, m]`` and ``input`` (if
    given) ``[B, m, m]``, all of one dtype and device."""
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1] or a.shape[1] != b.shape[2]:
        raise ValueError(f"sym_bmm takes a [B, m, k] and b [B, k, m], got {tuple(a.shape)} and {tuple(b.shape)}")
    if input is not None and tuple(input.shape) != (a.shape[0], a.shape[1], a.shape[1]):
        raise ValueError(f"sym_bmm takes an input [B, m, m] for a {tuple(a.shape)}, got {tuple(input.shape)}")
    for t in (b,) if input is None else (b, input):
        if t.dtype != a.dtype or t.device != a.device:
            raise ValueError(f"sym_bmm takes tensors of one dtype and device, got {a.dtype} / {t.dtype} on {a.device} / {t.device}")


if triton is not None:

    @triton.jit
    def _upper_tile(pid):
        """Tile ``(ti, tj)``, ``ti <= tj``, of program ``pid`` in the upper triangle taken
        column by column (``pid = tj (tj + 1) / 2 + ti``): ``tj`` from the square root, whose
        float rounding near a triangle number is corrected by one either way."""
        tj = ((tl.sqrt((8 * pid + 1).to(tl.float32)) - 1) / 2).to(tl.int32)
        tj = tl.where(tj * (tj + 1) // 2 > pid, tj - 1, tj)
        tj = tl.where((tj + 1) * (tj + 2) // 2 <= pid, tj + 1, tj)
        return pid - tj * (tj + 1) // 2, tj

    @triton.jit
    def _sym_bmm_kernel(
        a_ptr, b_ptr, c_ptr, d_ptr, M, K, beta, alpha,
        stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn, stride_cb, stride_cm, stride_cn,
        stride_db, stride_dm, stride_dn,
        TILE: tl.constexpr, TILE_K: tl.constexpr, BF16_INTERPRETED: tl.constexpr, HAS_INPUT: tl.constexpr,
    ):
        """One ``TILE x TILE`` tile ``(ti, tj)`` on or above the diagonal (:func:`_upper_tile`
        of ``program_id(0)``) of batch entry ``program_id(1)``; the tiles below are its mirrors.
        With ``HAS_INPUT``, ``alpha * (a b) + beta * d`` in fp32, ``d`` being symmetric."""
        ti, tj = _upper_tile(tl.program_id(0))
        batch = tl.program_id(1).to(tl.int64)  # batch * stride_ab may pass 2^31
        rows = ti * TILE + tl.arange(0, TILE)
        cols = tj * TILE + tl.arange(0, TILE)
        inner = tl.arange(0, TILE_K)
        a_base = a_ptr + batch * stride_ab
        b_base = b_ptr + batch * stride_bb
        acc = tl.zeros((TILE, TILE), dtype=tl.float32)
        for k0 in range(0, K, TILE_K):
            ks = k0 + inner
            a = tl.load(
                a_base + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0,
            )
            b = tl.load(
                b_base + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                mask=(ks[:, None] < K) & (cols[None, :] < M), other=0.0,
            )
            if BF16_INTERPRETED:  # the same products (exact in fp32), summed in fp32: see ``launch``
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        inside = (rows[:, None] < M) & (cols[None, :] < M)
        if HAS_INPUT:
            d = tl.load(d_ptr + batch * stride_db + rows[:, None] * stride_dm + cols[None, :] * stride_dn, mask=inside, other=0.0)
            acc = alpha * acc + beta * d.to(tl.float32)
        if BF16_INTERPRETED:  # the interpreter rounds fp32 to bf16 toward zero: to nearest, ties to even, first
            acc = bf16_rounded(acc)
        c = acc.to(c_ptr.dtype.element_ty)
        if ti == tj:  # the lower half is the upper half mirrored, not the dot's own lower half
            c = tl.where(rows[:, None] <= cols[None, :], c, tl.trans(c))
        c_base = c_ptr + batch * stride_cb
        tl.store(c_base + rows[:, None] * stride_cm + cols[None, :] * stride_cn, c, mask=inside)
        if ti != tj:  # the mirror, C[col, row] = C[row, col], stored row by row as the tile is
            mirror = (cols[:, None] < M) & (rows[None, :] < M)
            tl.store(c_base + cols[:, None] * stride_cm + rows[None, :] * stride_cn, tl.trans(c), mask=mirror)


def launch(
    a: Tensor,
    b: Tensor,
    tiles: Tiles | None = None,
    out: Tensor | None = None,
    input: Tensor | None = None,  # noqa: A002 - baddbmm's name
    beta: float = 1.0,
    alpha: float = 1.0,
) -> Tensor:
    """Run the Triton kernel: ``a @ b``, or with ``input`` ``beta * input + alpha * (a @ b)``
    (see the module docstring), into ``out`` (a new contiguous ``[B, m, m]`` tensor by
    default). Needs Triton and a device it runs on (a GPU, or the CPU under
    ``TRITON_INTERPRET=1``). Under the interpreter a bf16 tile is
    converted to fp32 before ``tl.dot`` (Triton 3.9's interpreter multiplies bf16 tiles
    wrongly): the same products, exact in fp32, summed in fp32, as on a GPU; and the sum is
    rounded to bf16 to nearest, ties to even, as a GPU's conversion does (the interpreter's
    rounds toward zero, twice as far off and always towards zero: a Newton–Schulz evaluation
    through it strayed about twice as far from the exact one)."""
    if triton is None:
        raise RuntimeError("muon_compile.kernels.sym.launch needs Triton (pip install triton)")
    check_operands(a, b, input)
    batch, m, k = a.shape
    if out is None:
        out = torch.empty((batch, m, m), dtype=a.dtype, device=a.device)
    if batch == 0 or m == 0:
        return out
    if k == 0:
        return out.copy_(input).mul_(beta) if input is not None else out.zero_()
    d = out if input is None else input  # read only with an input
    t = tiles or tiles_for(m, k)
    tile_count = triton.cdiv(m, t.tile)
    # (torch 2.11's wrap_triton refuses the interpreter's kernel object: launched as it is there)
    kernel = _sym_bmm_kernel if interpreted() else _wrap(_sym_bmm_kernel)
    with on(a.device):
        for start in range(0, batch, MAX_BATCH_PER_LAUNCH):
            part = slice(start, start + MAX_BATCH_PER_LAUNCH)
            a_part, b_part, out_part, d_part = a[part], b[part], out[part], d[part]
            kernel[(tile_count * (tile_count + 1) // 2, a_part.shape[0])](
                a_part, b_part, out_part, d_part, m, k, float(beta), float(alpha),
                a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1), b.stride(2),
                out.stride(0), out.stride(1), out.stride(2), d.stride(0), d.stride(1), d.stride(2),
                TILE=t.tile, TILE_K=t.tile_k, BF16_INTERPRETED=a.dtype == torch.bfloat16 and interpreted(),
                HAS_INPUT=input is not None, num_warps=t.num_warps, num_stages=t.num_stages,
            )
    return out


def _wrap(kernel):  # noqa: ANN001, ANN202
    """The kernel as a traceable call inside the op (``wrap_triton``), plain otherwise."""
    from torch.library import wrap_triton

    return wrap_triton(kernel)


@torch.library.triton_op(_QUALNAME, mutates_args=())
def _sym_bmm(a: Tensor, b: Tensor, input: Tensor | None = None, beta: float = 1.0, alpha: float = 1.0) -> Tensor:  # noqa: A002
    check_operands(a, b, input)
    # traced on the CPU (fake tensors, under the interpreter): the generated code calls bmm,
    # as Inductor cannot run a Triton kernel on the CPU
    traced_on_cpu = a.device.type == "cpu" and is_fake(a)
    if a.dtype in DTYPES and triton_usable(a.device) and not traced_on_cpu:
        return launch(a, b, input=input, beta=beta, alpha=alpha)
    if input is None:
        return torch.bmm(a, b)
    return torch.baddbmm(input, a, b, beta=beta, alpha=alpha)


SYM_BMM = torch.ops.muon_compile.sym_bmm.default


def sym_bmm(a: Tensor, b: Tensor, input: Tensor | None = None, beta: float = 1.0, alpha: float = 1.0) -> Tensor:  # noqa: A002
    """``a @ b``, or ``beta * input + alpha * (a @ b)`` for a symmetric ``input``, for a
    symmetric result (see the module docstring), through the op."""
    if input is None:
        return SYM_BMM(a, b)
    return SYM_BMM(a, b, input, beta, alpha)

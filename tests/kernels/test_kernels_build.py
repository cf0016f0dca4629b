"""This package's Triton kernels compile for the GPUs the issues target (sm_90: H100, H200)
on this CPU, by Triton's own compiler and the ``ptxas`` its wheel carries: what the
interpreter, which runs the kernels here, does not check (types, layouts, the tensor-core
instructions ``tl.dot`` becomes, vector access, shared memory). No GPU is needed or used."""

import re

import pytest
import torch

from muon_compile.kernels import scale_add as scale_add_kernel, sym as sym_kernel

triton = pytest.importorskip("triton", reason="needs Triton (pip install triton)")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import triton.language as tl  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)
SM90_SHARED_BYTES = 227 * 1024  # an H100's / H200's most shared memory per block: more fails at launch


def ptx_for(kernel, signature, constexprs, divisible=(), **options):
    """The PTX of ``kernel`` for sm_90: ``signature`` the arguments' Triton types,
    ``constexprs`` the compile-time ones, ``divisible`` the arguments known to be multiples
    of 16 (as Triton's launcher specialises aligned pointers and sizes). Its shared memory
    must fit an sm_90 block."""
    names = kernel.arg_names
    types = {n: signature.get(n, "constexpr") for n in names}
    assert set(types.values()) != {"constexpr"} and all(n in signature or n in constexprs for n in names), names
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    compiled = triton.compile(ASTSource(kernel, types, constexprs, attrs), target=SM90, options=options)
    assert compiled.metadata.shared <= SM90_SHARED_BYTES, f"{compiled.metadata.shared} bytes of shared memory"
    return compiled.asm["ptx"]


@pytest.mark.parametrize(("cautious", "src_scaled"), [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("dst", [torch.float32, torch.bfloat16])
def test_scale_add_kernel_builds_with_vector_access_and_one_rounding(dst, cautious, src_scaled):
    dst_tl = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dst]
    signature = {
        "table_ptr": "*i64", "src_ptr": "*bf16", "scale_ptr": "*fp64", "alpha_ptr": "*fp64", "scale_value": "fp32",
        "alpha_value": "fp32", "src_scale": "fp32", "M": "i32", "N": "i32", "col_tiles": "i32", "tiles": "i32",
        "stride_sb": "i32", "stride_sm": "i32",
    }
    constexprs = {
        "stride_sn": 1, "DST": getattr(tl, {"fp32": "float32", "bf16": "bfloat16"}[dst_tl]), "SRC": tl.bfloat16,
        "TILE_M": scale_add_kernel.TILE_ROWS, "TILE_N": scale_add_kernel.TILE_COLS, "ON_DEVICE": True,
        "CAUTIOUS": cautious, "SRC_SCALED": src_scaled, "BF16_INTERPRETED": False, "SRC_BF16_INTERPRETED": False,
        "ALIGNED": True,
    }
    ptx = ptx_for(scale_add_kernel._scale_add_kernel, signature, constexprs, ("table_ptr", "src_ptr", "N", "stride_sb", "stride_sm"))
    assert "fma.rn.f32" in ptx  # alpha * src added with one rounding
    assert re.search(r"st\.global\.v\d", ptx), "the members' stores are not vectorised"


@pytest.mark.parametrize("has_input", [False, True])
@pytest.mark.parametrize("m", [256, 1024])
def test_sym_kernel_builds_on_tensor_cores(m, has_input):
    tiles = sym_kernel.tiles_for(m, 4 * m)
    signature = {n: "*bf16" for n in ("a_ptr", "b_ptr", "c_ptr", "d_ptr")} | {"beta": "fp32", "alpha": "fp32"}
    signature |= {n: "i32" for n in sym_kernel._sym_bmm_kernel.arg_names if n.startswith("stride") or n in ("M", "K")}
    constexprs = {"TILE": tiles.tile, "TILE_K": tiles.tile_k, "BF16_INTERPRETED": False, "HAS_INPUT": has_input}
    ptx = ptx_for(
        sym_kernel._sym_bmm_kernel, signature, constexprs, ("a_ptr", "b_ptr", "c_ptr", "d_ptr", "M", "K"),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    assert re.search(r"\b(wgmma|mma)\.", ptx), "tl.dot did not become tensor-core instructions"

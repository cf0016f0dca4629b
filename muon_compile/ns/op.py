"""``muon_compile::newton_schulz``: the op that the optimizers emit and the passes rewrite;
:func:`newton_schulz_any`, which calls it or the row-sharded op
(:mod:`muon_compile.distributed.sharded_op`) as the input's layout needs (:mod:`muon_compile.distributed.routing`);
and :func:`newton_schulz`, the public function.

Schema::

    newton_schulz(Tensor x, <NSArgs.SCHEMA>) -> Tensor

``x`` is one matrix (2-D) or a batch of matrices (3-D, each orthogonalised on its own);
the arguments after it are :class:`muon_compile.ns.args.NSArgs` in its flat form. The
result has ``x``'s shape and dtype. The op is functional, has a fake implementation for
tracing, and a DTensor sharding rule that asks for a replicated input (a batch may also
stay sharded on its batch dimension).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from .. import config
from ..compile import cpu_heap
from ..distributed.routing import Kind, layout_of, wrap_like
from ..distributed.sharded_op import sharded_newton_schulz_op
from . import coefficients as coeffs
from .args import NSArgs
from .evaluate import orthogonalize
from .op_support import check_input, register_no_derivative

_QUALNAME = "muon_compile::newton_schulz"


torch.library.define(_QUALNAME, f"(Tensor x, {NSArgs.SCHEMA}) -> Tensor")


@torch.library.impl(_QUALNAME, "CompositeExplicitAutograd")
def _newton_schulz_impl(x: Tensor, *flat: object) -> Tensor:
    args = NSArgs.from_op(flat)
    check_input(x)
    cfg = config.current()
    if x.device.type == "cpu":  # an eager CPU step's buffers too: the op's are most of them
        cpu_heap.keep(cfg.cpu_heap_mb)
    return orthogonalize(x, args, cfg.ns_algorithm, epilogue=cfg.ns_epilogue, orientation=cfg.ns_orientation, eager=True)


@torch.library.register_fake(_QUALNAME)
def _newton_schulz_fake(x: Tensor, *flat: object) -> Tensor:
    NSArgs.from_op(flat)
    check_input(x)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


register_no_derivative(_QUALNAME)
NEWTON_SCHULZ = torch.ops.muon_compile.newton_schulz.default


def newton_schulz_op(x: Tensor, args: NSArgs) -> Tensor:
    """Call the op on ``x`` with ``args`` (its flat form is :meth:`NSArgs.to_op`)."""
    return NEWTON_SCHULZ(x, *args.to_op())


def split_args(args: Sequence[object]) -> tuple[object, NSArgs]:
    """An op call's arguments as ``(x, NSArgs)``."""
    return args[0], NSArgs.from_op(args[1:])


def _register_sharding() -> None:
    """Replicate in, replicate out; a 3-D batch may instead stay ``Shard(0)`` on its batch dim."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding

    @register_sharding(NEWTON_SCHULZ)
    def _ns_sharding(x, *flat):
        no_args = [None] * len(flat)
        strategies = [([Replicate()], [Replicate(), *no_args])]
        if len(x.shape) == 3:
            strategies.append(([Shard(0)], [Shard(0), *no_args]))
        return strategies


if torch.distributed.is_available():
    _register_sharding()


def newton_schulz_any(x: Tensor, args: NSArgs, tp_mode: str | None = None) -> Tensor:
    """``newton_schulz`` of ``x`` with the op its layout under ``tp_mode`` needs
    (:func:`~muon_compile.distributed.routing.layout_of`); the result has ``x``'s layout."""
    layout = layout_of(x, tp_mode)
    if not isinstance(x, DTensor) or layout.kind is Kind.DTENSOR:
        return newton_schulz_op(x, args)
    local = x.to_local()
    if layout.kind is Kind.LOCAL:
        out = newton_schulz_op(local, args)
    else:
        out = sharded_newton_schulz_op(local, layout.shard, args)
    return wrap_like(out, x)


def newton_schulz_routed(x: Tensor, *flat: object) -> Tensor:
    """:func:`newton_schulz_any` with the op's flat arguments: the call ``canonicalize``
    puts in a Dynamo graph for a DTensor (graph arguments stay plain values)."""
    return newton_schulz_any(x, NSArgs.from_op(flat))


def newton_schulz(
    x: Tensor,
    coefficients: coeffs.CoefficientSpec = "keller",
    steps: int = 5,
    *,
    eps: float | None = None,
    compute_dtype: torch.dtype = torch.bfloat16,
    clamp_eps: bool = False,
    algorithm: str = "auto",
) -> Tensor:
    """Orthogonalise ``x`` (a matrix or a batch of matrices) by Newton–Schulz iteration.

    Args:
        x: 2-D matrix or 3-D batch; a tall matrix is handled through its transpose. A
            DTensor is handled by its layout (see :mod:`muon_compile.distributed.routing`); the
            result has the same placements.
        coefficients: a preset name (:mod:`muon_compile.ns.coefficients`), one ``(a, b, c)``
            triple, or a list of per-iteration triples (the last one repeats).
        steps: number of iterations.
        eps: added to the scaled Frobenius norm before dividing (default: the preset's).
        compute_dtype: dtype of the iteration's matmuls (bf16 by default; fp32 allowed).
        clamp_eps: divide by ``max(norm, eps)`` instead of ``norm + eps``.
        algorithm: ``"textbook"`` (iterate on ``X``), ``"gram"`` (iterate on ``X X^T``, fewer
            FLOPs for wide matrices) or ``"auto"`` (the cheaper one for the shape, dtype
            and device, see :mod:`muon_compile.ns.cost`; ``MUON_COMPILE_NS_ALGORITHM``
            overrides it).

    Returns:
        A tensor with ``x``'s shape and dtype.
    """
    args = coeffs.ns_args(coefficients, steps, eps=eps, compute_dtype=compute_dtype, clamp_eps=clamp_eps, algorithm=algorithm)
    return newton_schulz_any(x, args)

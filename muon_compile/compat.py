"""Differences between the torch versions this package supports, one line each, in one place.

Every use of behaviour that changed between torch releases goes through a name defined
here, with the version that changed it, so a new release is one edit.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Shard

_VERSION = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])

# torch 2.11 and 2.12 (2.12 read in its source, not run): Inductor's C++ code generation
# caches each fp32 -> bf16 cast's source and hands it back for the bf16 -> fp32 cast that
# follows inside the same fused kernel, even under ``emulate_precision_casts``, so
# ``x.to(bfloat16).float()`` is ``x`` there; 2.13 honours the flag (pytorch#185337).
# Triton code never had the cache. Read by :mod:`muon_compile.rounding_cast`.
CPU_FUSION_DROPS_ROUND_TRIP = _VERSION < (2, 13)

# torch 2.15: Dynamo records the view attributes ``X.mT`` / ``X.T`` as calls of the aten ops
# behind them (``aten.mT``, ``aten.numpy_T``); 2.13 recorded ``getattr(X, "mT")``. Both ops
# exist in every supported version, so the table is always complete. Value: the
# transpose kind of ns_walk (``"mT"``: the last two dims; ``"t"``: a 2-D transpose only).
VIEW_ATTRIBUTE_OPS: dict[object, str] = {
    torch.ops.aten.mT: "mT",
    torch.ops.aten.mT.default: "mT",
    torch.ops.aten.numpy_T: "t",
    torch.ops.aten.numpy_T.default: "t",
}


def is_shard(placement: object) -> bool:
    """Whether ``placement`` is a plain ``Shard(dim)``.

    torch 2.11: under Dynamo, ``type()`` of an intermediate DTensor's placement is not the
    ``Shard`` class itself, so ``type(p) is Shard`` routed FSDP2 updates to DTensor's
    fallback; ``isinstance`` holds in every supported version, and ``_StridedShard`` is
    no ``Shard`` subclass in any of them (2.11 – 2.15).
    """
    return isinstance(placement, Shard)

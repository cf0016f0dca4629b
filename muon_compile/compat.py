"""Differences between the torch versions this package supports, one line each, in one place.

Every use of behaviour that changed between torch releases goes through a name defined
here, with the version that changed it, so a new release is one edit.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Shard

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

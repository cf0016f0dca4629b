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
# Triton code never had the cache. Read by :mod:`muon_compile.ns.rounding_cast`.
CPU_FUSION_DROPS_ROUND_TRIP = _VERSION < (2, 13)

# torch 2.15: Dynamo records the view attributes ``X.mT`` / ``X.T`` as calls of the aten ops
# behind them (``aten.mT``, ``aten.numpy_T``); 2.13 recorded ``getattr(X, "mT")``. Both ops
# exist in every supported version, so the table is always complete. Value: the
# transpose kind of the canonicalize walk (``"mT"``: the last two dims; ``"t"``: a 2-D transpose only).
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


# torch 2.11 and 2.12 (2.12 not run): Dynamo's compile metrics log its configuration with
# every set sorted, so a set of functions in ``ignore_logging_functions`` raises inside
# that logging (an error traceback per compile, the compile itself goes on); 2.13 and
# later log it unsorted. Read by :mod:`muon_compile.compile.tracing`, which leaves that set alone there.
DYNAMO_SORTS_CONFIG_SETS = _VERSION < (2, 13)

# torch 2.11 (2.12 not run): Dynamo specialises a Python-float hyper-parameter, so each value a
# scheduler gives it recompiles the step (8 graphs in 12 steps, then eager); 2.13 and 2.15 make
# it an input at its first change (one recompile), given tensorify.alpha_as_product. Read by
# the explanation, which warns at the first such recompile where every change recompiles.
DYNAMO_SPECIALIZES_FLOATS = _VERSION < (2, 13)

# torch 2.11 (2.12 not run): Dynamo traces ``x.add_(u, alpha=a)`` as ``x.add_(u * a)``, the
# product in ``u``'s dtype, so a bf16 update is rounded to bf16 again after ``* a``, which
# eager does not (and the default backend keeps); 2.13 leaves a number ``alpha`` to ``add_`` and
# takes a tensor one by ``fma``. The ``stack_writes`` pass keeps that rounding (a number ``a``
# is the write's ``src_scale``) but leaves per parameter a tensor ``a`` (a tensor lr), which it
# cannot express. Read by the tests.
DYNAMO_ROUNDS_ALPHA_PRODUCTS = _VERSION < (2, 13)


# torch 2.11 and 2.13 (2.12 and 2.14 not run): Dynamo mishandles the end of an inlined
# ``x = yield from g()``: 2.13 pushes the value sent (None) instead of g's return value, so the
# step splits where ``x`` is first used; 2.11 fails the compile (``Cannot construct
# ConstantVariable`` of the returned list, raised to the caller). 2.15 pushes the return value.
# Dion's Muon returns each group's orthogonalised list this way. Read by
# :mod:`muon_compile.compile.generator_returns`, which passes the value there.
DYNAMO_DROPS_YIELD_FROM_RETURN = _VERSION < (2, 15)
DYNAMO_FAILS_ON_YIELD_FROM_RETURN = _VERSION < (2, 13)  # where it drops it: 2.11's failure


def dynamo_constant_folds() -> tuple[dict, dict]:
    """Dynamo's tables of functions it calls while tracing instead of recording them:
    ``(all of them, those whose result is guarded)``. Private, the same two dicts in
    ``torch._dynamo.variables.torch`` in every supported version (2.11 – 2.15)."""
    from torch._dynamo.variables import torch as dynamo_torch

    return dynamo_torch.constant_fold_functions, dynamo_torch.constant_fold_functions_need_guards


def recompile_reason() -> str | None:
    """Why Dynamo is compiling the current frame again (its first failed guard), read
    inside a backend; None on a first compile or where torch does not record it. Dynamo
    puts it in its compile metrics (private; the same key in 2.11 – 2.15)."""
    try:
        from torch._dynamo.utils import get_metrics_context

        return get_metrics_context()._metrics.get("recompile_reason")  # noqa: SLF001
    except Exception:  # noqa: BLE001 - a missing private detail must never fail a compile
        return None


def tolerate_unread_users() -> None:
    """torch 2.13 and 2.15 (not 2.11): Inductor's C++ outer-loop fusion asks every user of a
    buffer for the index it loads the buffer at (``LoopBody.get_read_expr``), and a user that
    only orders after the buffer without loading it raises ``KeyError``, failing the compile
    (two reductions over a normalised matrix fused with the in-place momentum write that
    made it: ``ns.evaluate.normalized``). Its one caller asks "contiguous or not": a missing
    load now answers None, "not contiguous", and that fusion with a local buffer is skipped.
    Patched once, by :mod:`muon_compile.compile.backend` (the compiles it makes are the ones that
    trace ``ns.evaluate``)."""
    from torch._inductor.loop_body import LoopBody

    original = LoopBody.get_read_expr
    if getattr(original, "_tolerates_unread_users", False):
        return

    def get_read_expr(self, buffer_name):  # noqa: ANN001, ANN202
        try:
            return original(self, buffer_name)
        except KeyError:
            return None

    get_read_expr._tolerates_unread_users = True  # type: ignore[attr-defined]
    LoopBody.get_read_expr = get_read_expr


# torch 2.11 and 2.12 (2.12 read in its source, not run): the first time Inductor falls back
# to an op it has no lowering for (this package's custom ops), it formats every argument for an
# INFO log line, logged or not (2.13 formats it lazily, pytorch's LazyString). An argument's
# text holds its inputs' texts, and a bucket's Newton–Schulz products read each other, so the
# text of the stacks' write's source (the last product, passes/writes/write_source.py) grows about
# 8-fold per iteration: a 4 x 64x128 textbook step at 5 iterations compiled in 28.2 s, 19.9 s
# patched, on this project's CPU, and each further iteration multiplies the extra time by about
# 8. Read by :func:`lazy_fallback_log`.
EAGER_FALLBACK_LOG = _VERSION < (2, 13)


def lazy_fallback_log() -> None:
    """Where :data:`EAGER_FALLBACK_LOG`: ``OperatorIssue.operator_str`` returns text made when
    it is read (by a log record that is emitted, or an error's message), as on torch 2.13.
    Patched once, by :mod:`muon_compile.compile.backend`."""
    if not EAGER_FALLBACK_LOG:
        return
    from torch._inductor.exc import OperatorIssue

    original = OperatorIssue.operator_str
    if getattr(original, "_lazy", False):
        return

    class _Text:
        def __init__(self, *call: object) -> None:
            self.call = call

        def __str__(self) -> str:
            return original(*self.call)

    def operator_str(target, args, kwargs):  # noqa: ANN001, ANN202
        return _Text(target, args, kwargs)

    operator_str._lazy = True  # type: ignore[attr-defined]
    OperatorIssue.operator_str = staticmethod(operator_str)

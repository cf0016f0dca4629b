"""Let Dynamo trace the step code people write around a Newton–Schulz loop in one graph.

Four habits of public Muon code break Dynamo's graph in the middle of the loop, so the
loop is never seen whole and cannot be recognised (see docs/recognised.md):

* a setting read inside the step, e.g. ``torch.get_float32_matmul_precision()``
  (Megatron's Newton–Schulz picks bf16 when it returns "medium"): Dynamo records no
  call that returns a string. Installed, Dynamo calls it while tracing and guards on the
  result, so a changed setting recompiles: exact, nothing is dropped.
* a logging call inside the step or the loop (a logger's, the standard library's or absl's
  module functions, ``warnings.warn``): Dynamo cannot put it in a graph. Installed, the
  compiled step makes it after its graph (:mod:`muon_compile.compile.logging_calls`).
* ``torch._dynamo.utils.disable_cache_limit()`` around a step (HeavyBall's): Dynamo cannot
  enter it, so it skipped the whole step. Installed, it is a no-op inside traced code (the
  recompile limits it lifts are read when Dynamo decides to recompile, outside any graph)
  and itself in eager code.
* a generator's return value taken by ``x = yield from g()`` (Dion's async tasks): torch 2.13's
  Dynamo makes it None, so the step splits where ``x`` is used, and 2.11's fails the compile.
  Installed, it is the returned value, as in eager code (:mod:`muon_compile.compile.generator_returns`).

The logging calls are left to split the step on torch 2.11 / 2.12, whose compile metrics
cannot log that setting (:data:`compat.DYNAMO_SORTS_CONFIG_SETS`).

Installed when the package is imported (which ``backend="muon"`` does) unless
``MUON_COMPILE_TRACE_HELPERS=0``; :func:`install` switches it at run time. It changes
Dynamo's configuration for the whole process, so also for other backends.
"""

from __future__ import annotations

import contextlib

import torch
import torch._dynamo.utils

from . import generator_returns
from .compat import DYNAMO_SORTS_CONFIG_SETS, dynamo_constant_folds

# settings Dynamo may read while tracing (guarded: a change recompiles)
FOLDED_SETTINGS = (
    torch.get_float32_matmul_precision,
    torch.are_deterministic_algorithms_enabled,
    torch.is_deterministic_algorithms_warn_only_enabled,
)

_DISABLE_CACHE_LIMIT = torch._dynamo.utils.disable_cache_limit


def _traceable_disable_cache_limit() -> contextlib.AbstractContextManager:
    """``torch._dynamo.utils.disable_cache_limit()`` as Dynamo can trace it: a no-op in a
    traced step, the original otherwise."""
    if torch.compiler.is_compiling():
        return contextlib.nullcontext()
    return _DISABLE_CACHE_LIMIT()


_installed = False


def install(enabled: bool = True) -> None:
    """Add (``enabled``) or remove this package's entries in Dynamo's configuration.
    Entries Dynamo already had are never removed."""
    global _installed
    if enabled == _installed:
        return
    folds, guarded = dynamo_constant_folds()
    if enabled:
        added = [f for f in FOLDED_SETTINGS if f not in folds]
        for fn in added:
            folds[fn] = None
            guarded[fn] = None
        _added_folds[:] = added
        torch._dynamo.utils.disable_cache_limit = _traceable_disable_cache_limit
    else:
        for fn in _added_folds:
            folds.pop(fn, None)
            guarded.pop(fn, None)
        _added_folds.clear()
        torch._dynamo.utils.disable_cache_limit = _DISABLE_CACHE_LIMIT
    generator_returns.install(enabled)
    if not DYNAMO_SORTS_CONFIG_SETS:
        from . import logging_calls

        logging_calls.install(enabled)
    _installed = enabled


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _installed


_added_folds: list = []

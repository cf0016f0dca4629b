"""Let Dynamo trace the step code people write around a Newton–Schulz loop in one graph.

Two habits of public Muon code break Dynamo's graph in the middle of the loop, so the
loop is never seen whole and cannot be recognised (see docs/recognised.md):

* a setting read inside the step, e.g. ``torch.get_float32_matmul_precision()``
  (Megatron's Newton–Schulz picks bf16 when it returns "medium"): Dynamo records no
  call that returns a string. Installed, Dynamo calls it while tracing and guards on the
  result, so a changed setting recompiles: exact, nothing is dropped.
* a ``logger.debug`` / ``logger.info`` call inside the step or the loop: Dynamo cannot
  put it in a graph. Installed, Dynamo drops these calls from compiled code (its
  ``ignore_logging_functions``); they still run in eager code. Warnings and errors are
  left alone (they still break the graph, and run), and so is ``logger.log(level, ...)``,
  whose level Dynamo's setting cannot see: the explanation names its graph break.
* module-level logging (``logging.info(...)``, or absl's, as NVIDIA's Emerging-Optimizers
  logs): ``debug`` / ``info`` (absl's ``vlog`` too) are dropped like the methods above;
  ``warning`` / ``error`` / ``log(level, ...)`` are moved after the graph (Dynamo's
  ``reorderable_logging_functions``): they run once the compiled step has, where their
  arguments are tensors, numbers or strings (other arguments still break the graph).
* ``torch._dynamo.utils.disable_cache_limit()`` around a step (HeavyBall's): Dynamo cannot
  enter it, so it skipped the whole step. Installed, it is a no-op inside traced code (the
  recompile limits it lifts are read when Dynamo decides to recompile, outside any graph)
  and itself in eager code.

The logging entries are not installed on torch 2.11 / 2.12, whose compile metrics cannot
log those settings (:data:`compat.DYNAMO_SORTS_CONFIG_SETS`).

Installed when the package is imported (which ``backend="muon"`` does) unless
``MUON_COMPILE_TRACE_HELPERS=0``; :func:`install` switches it at run time. It changes
Dynamo's configuration for the whole process, so also for other backends.
"""

from __future__ import annotations

import contextlib
import logging

import torch
import torch._dynamo.utils

from .compat import DYNAMO_SORTS_CONFIG_SETS, dynamo_constant_folds

# settings Dynamo may read while tracing (guarded: a change recompiles)
FOLDED_SETTINGS = (
    torch.get_float32_matmul_precision,
    torch.are_deterministic_algorithms_enabled,
    torch.is_deterministic_algorithms_warn_only_enabled,
)
def _absl_logging() -> object | None:
    try:
        from absl import logging as absl_logging
    except ImportError:
        return None
    return absl_logging


_ABSL = _absl_logging()
# debug / info calls compiled code drops: logger methods, the standard library's module
# functions, absl's (vlog: verbose info)
_DROPPED = (logging.Logger.debug, logging.Logger.info, logging.debug, logging.info)
_DROPPED_ABSL = () if _ABSL is None else (_ABSL.debug, _ABSL.info, _ABSL.vlog)
DROPPED_LOGGING = () if DYNAMO_SORTS_CONFIG_SETS else _DROPPED + _DROPPED_ABSL
# module-level logging at any level, which compiled code calls after the graph
_REORDERED = (logging.warning, logging.error, logging.log)
_REORDERED_ABSL = () if _ABSL is None else (_ABSL.warning, _ABSL.error, _ABSL.log)
REORDERED_LOGGING = () if DYNAMO_SORTS_CONFIG_SETS else _REORDERED + _REORDERED_ABSL
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
    ignored = torch._dynamo.config.ignore_logging_functions
    reordered = torch._dynamo.config.reorderable_logging_functions
    if enabled:
        added = [f for f in FOLDED_SETTINGS if f not in folds]
        for fn in added:
            folds[fn] = None
            guarded[fn] = None
        _added_folds[:] = added
        _added_logging[:] = [f for f in DROPPED_LOGGING if f not in ignored]
        ignored.update(_added_logging)
        _added_reordered[:] = [f for f in REORDERED_LOGGING if f not in reordered]
        reordered.update(_added_reordered)
        torch._dynamo.utils.disable_cache_limit = _traceable_disable_cache_limit
    else:
        for fn in _added_folds:
            folds.pop(fn, None)
            guarded.pop(fn, None)
        ignored.difference_update(_added_logging)
        reordered.difference_update(_added_reordered)
        _added_folds.clear()
        _added_logging.clear()
        _added_reordered.clear()
        torch._dynamo.utils.disable_cache_limit = _DISABLE_CACHE_LIMIT
    _installed = enabled


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _installed


_added_folds: list = []
_added_logging: list = []
_added_reordered: list = []

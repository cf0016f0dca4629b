"""Let Dynamo trace the step code people write around a Newton–Schulz loop in one graph.

Two habits of public Muon code break Dynamo's graph in the middle of the loop, so the
loop is never seen whole and cannot be recognised (see README, "Recognised spellings"):

* a setting read inside the step, e.g. ``torch.get_float32_matmul_precision()``
  (Megatron's Newton–Schulz picks bf16 when it returns "medium"): Dynamo records no
  call that returns a string. Installed, Dynamo calls it while tracing and guards on the
  result, so a changed setting recompiles: exact, nothing is dropped.
* a ``logger.debug`` / ``logger.info`` call inside the step or the loop: Dynamo cannot
  put it in a graph. Installed, Dynamo drops these calls from compiled code (its
  ``ignore_logging_functions``); they still run in eager code. Warnings and errors are
  left alone (they still break the graph, and run). Not on torch 2.11 / 2.12, whose
  compile metrics cannot log that setting (:data:`compat.DYNAMO_SORTS_CONFIG_SETS`).

Installed when the package is imported (which ``backend="muon"`` does) unless
``MUON_COMPILE_TRACE_HELPERS=0``; :func:`install` switches it at run time. It changes
Dynamo's configuration for the whole process, so also for other backends.
"""

from __future__ import annotations

import logging

import torch

from .compat import DYNAMO_SORTS_CONFIG_SETS, dynamo_constant_folds

# settings Dynamo may read while tracing (guarded: a change recompiles)
FOLDED_SETTINGS = (
    torch.get_float32_matmul_precision,
    torch.are_deterministic_algorithms_enabled,
    torch.is_deterministic_algorithms_warn_only_enabled,
)
# logger methods whose calls compiled code drops
DROPPED_LOGGING = () if DYNAMO_SORTS_CONFIG_SETS else (logging.Logger.debug, logging.Logger.info)

_installed = False


def install(enabled: bool = True) -> None:
    """Add (``enabled``) or remove this package's entries in Dynamo's configuration.
    Entries Dynamo already had are never removed."""
    global _installed
    if enabled == _installed:
        return
    folds, guarded = dynamo_constant_folds()
    ignored = torch._dynamo.config.ignore_logging_functions
    if enabled:
        added = [f for f in FOLDED_SETTINGS if f not in folds]
        for fn in added:
            folds[fn] = None
            guarded[fn] = None
        _added_folds[:] = added
        _added_logging[:] = [f for f in DROPPED_LOGGING if f not in ignored]
        ignored.update(_added_logging)
    else:
        for fn in _added_folds:
            folds.pop(fn, None)
            guarded.pop(fn, None)
        ignored.difference_update(_added_logging)
        _added_folds.clear()
        _added_logging.clear()
    _installed = enabled


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _installed


_added_folds: list = []
_added_logging: list = []

"""Logging calls inside a traced step, made after its graph instead of splitting it.

Dynamo cannot put a logging call in a graph: a ``logger.warning(...)``, absl's
``log_first_n``, or ``warnings.warn`` inside a step splits it there, and a Newton–Schulz loop
split from the rest of the step cannot be bucketed with it (NVIDIA Emerging-Optimizers logs
``log_first_n(INFO, ...)`` inside its Newton–Schulz function). Installed (by
:func:`muon_compile.compile.tracing.install`), Dynamo records each such call while tracing and the
compiled step makes it after the graph has run, every time it runs, in the order traced: the
message reaches the user as eager code gives it, after the step's arithmetic instead of amid
it. A tensor argument is the tensor after the step (where the step changes it in place
afterwards, its value then). An absl call is made as from the line of the step that made it
(:func:`made_at`): absl counts ``log_first_n`` / ``log_every_n`` by that line, as in eager code,
and the record names it. Other calls are made from the compiled frame: a logger's record names
its line, and ``warnings.warn``'s "once per location" counts it, the same every step.

Recorded: the standard library's module functions (``logging.debug`` ... ``critical``,
``logging.log``), absl's (``debug`` ... ``error``, ``log``, ``vlog``, ``log_first_n``,
``log_every_n``, ``log_every_n_seconds``, ``log_if``), ``warnings.warn``, and the level methods
of any ``logging.Logger`` Dynamo can load again after the graph (a module global, an attribute,
a closure; ``debug`` ... ``critical``, ``log``), absl's ``ABSLLogger`` included. Left to split
the step, which then runs them in place (``MUON_COMPILE_EXPLAIN=1`` names the break): a call
with keyword arguments (Dynamo would drop them), an argument that is not a tensor, number or
string (an object, ``warnings.warn``'s category class), ``exception`` / absl's ``fatal`` (they
read the exception being handled or end the program, in place), a logger the step makes itself.

Dynamo's own reordering (``torch._dynamo.config.reorderable_logging_functions``) is used, with
two corrections applied to every call it reorders, ``print`` included: a call inside a function
Dynamo inlines is kept (Dynamo made it only where the compiled frame itself calls it, and
silently dropped the others), and a call with keyword arguments splits the step instead of
being made without them. Not on torch 2.11 / 2.12 (:data:`compat.DYNAMO_SORTS_CONFIG_SETS`):
there these calls still split the step.
"""

from __future__ import annotations

import logging
import warnings

import torch._dynamo.config
from torch._dynamo.exc import unimplemented
from torch._dynamo.source import AttrSource, ImportSource
from torch._dynamo.variables import ConstantVariable, ListVariable, TensorVariable, TupleVariable
from torch._dynamo.variables.misc import DebuggingVariable, LoggingLoggerVariable, StringFormatVariable

# a Logger's methods made after the graph; ``exception`` and ``fatal`` stay where they are
LOGGER_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "log"})


def _absl_functions() -> tuple:
    try:
        from absl import logging as absl
    except ImportError:
        return ()
    names = ("debug", "info", "warning", "warn", "error", "log", "vlog",
             "log_first_n", "log_every_n", "log_every_n_seconds", "log_if")
    return tuple(getattr(absl, name) for name in names if hasattr(absl, name))


ABSL_FUNCTIONS = _absl_functions()
FUNCTIONS = (
    logging.debug, logging.info, logging.warning, logging.error, logging.critical, logging.log,
    warnings.warn, *ABSL_FUNCTIONS,
)


def made_at(site: tuple, fn, *args):
    """``fn(*args)``, an absl call made after a step's graph, as from the line of the step that
    made it (``site``: file, line, function). absl counts ``log_first_n``, ``log_every_n`` and
    ``log_every_n_seconds`` by the calling line and names it in the record: made from the
    compiled frame instead, every such call of a step would share one count (a
    ``log_first_n(..., 1)`` after another's ``log_first_n(..., 8)`` never logged). absl's
    logger reports ``site`` as the caller for the call's duration, in any thread."""
    from absl import logging as absl

    logger = absl.get_absl_logger()
    logger.findCaller = lambda stack_info=False, stacklevel=1: (*site, None)
    try:
        return fn(*args)
    finally:
        del logger.findCaller


def _made_at(tx, fn, args) -> tuple:
    """The recorded call of absl's ``fn`` from ``tx``'s current line: :func:`made_at`."""
    here = TupleVariable([ConstantVariable.create(v) for v in (tx.f_code.co_filename, tx.lineno, tx.f_code.co_name)])
    package, *path = (*__name__.split("."), "made_at")  # this module's made_at, as its import reaches it
    source = ImportSource(package)
    for name in path:
        source = AttrSource(source, name)
    return DebuggingVariable(made_at, source=source), [here, fn, *args]

_DYNAMO_CALL = DebuggingVariable.call_function
_DYNAMO_LOGGER_METHOD = LoggingLoggerVariable.call_method


def _reorderable(args) -> bool:
    """Whether Dynamo can make a call with ``args`` after the graph: tensors, constants and
    formatted strings (what Dynamo's own reordering takes, the same in torch 2.13 - 2.15), also
    inside tuples and lists (``log.debug("%s", (a, b, c))``)."""
    return all(
        _reorderable(a.items) if isinstance(a, (TupleVariable, ListVariable))
        else isinstance(a, (TensorVariable, ConstantVariable, StringFormatVariable))
        for a in args
    )


def _call_after_graph(self, tx, args, kwargs):
    """DebuggingVariable.call_function: the call recorded on the compiled frame, from
    whichever function Dynamo is inlining, or a graph break where it has keyword arguments
    or an argument Dynamo cannot make again after the graph."""
    if tx.export or not _reorderable(args):
        return _DYNAMO_CALL(self, tx, args, kwargs)
    if kwargs:
        unimplemented(
            gb_type="logging call with keyword arguments",
            context=f"fn: {self.value}, kwargs: {list(kwargs)}",
            explanation="muon_compile makes a step's logging calls after its graph, which Dynamo can do "
            "only without keyword arguments; this one runs in place, eagerly.",
            hints=["Pass the arguments by position, or log outside the optimizer step."],
        )
    call = _made_at(tx, self, args) if self.value in ABSL_FUNCTIONS else (self, list(args))
    tx.output.root_tx.debug_locals.append(call)
    return ConstantVariable.create(None)


def _logger_method(self, tx, name, args, kwargs):
    """LoggingLoggerVariable.call_method: a level method of a logger Dynamo can load again
    is made after the graph; anything else as Dynamo does it (a graph break)."""
    if name in LOGGER_METHODS and self.source is not None and not tx.export:
        method = getattr(self.value, name)
        return DebuggingVariable(method, source=AttrSource(self.source, name)).call_function(tx, args, kwargs)
    return _DYNAMO_LOGGER_METHOD(self, tx, name, args, kwargs)


_added: list = []


def install(enabled: bool) -> None:
    """Make (``enabled``) or stop making a step's logging calls after its graph. Functions
    Dynamo already reordered stay reordered."""
    reordered = torch._dynamo.config.reorderable_logging_functions
    if enabled:
        _added[:] = [f for f in FUNCTIONS if f not in reordered]
        reordered.update(_added)
        DebuggingVariable.call_function = _call_after_graph
        LoggingLoggerVariable.call_method = _logger_method
    else:
        reordered.difference_update(_added)
        _added.clear()
        DebuggingVariable.call_function = _DYNAMO_CALL
        LoggingLoggerVariable.call_method = _DYNAMO_LOGGER_METHOD

"""A generator's return value through ``yield from`` in a traced step (torch 2.11 – 2.13).

Dion's Muon (microsoft/dion, ``muon.py``) runs each same-shape group's update as a generator
task that gets its orthogonalised matrices as ``U = yield from megabatch_orthogonalize_async(...)``,
the sub-generator's ``return`` value. Dynamo before torch 2.15 (2.14 not run) ends an inlined
``yield from`` by pushing the value sent (``None``) where CPython pushes the value the
sub-generator returned (its ``StopIteration``'s): ``U`` is ``None``, the next
``_foreach_mul(U, lr)`` fails on fake tensors ("got (NoneType, FakeTensor)"), and the step is
split there, each group's Newton–Schulz loop alone in its graph, none bucketed; torch 2.11's
fails the compile (an internal ``AssertionError``, raised to the caller). torch 2.15's Dynamo
pushes the return value (``pygen_fetch_stopiteration_value``).

Installed (by :func:`muon_compile.compile.tracing.install`, on the versions of
:data:`compat.DYNAMO_DROPS_YIELD_FROM_RETURN`), Dynamo's ``SEND`` handler for inlined
generators advances an inlined sub-generator itself and, where it returns, pushes the value of
the ``StopIteration`` Dynamo raised for it and clears that exception, as CPython and torch
2.15 do. Every other ``SEND`` (another iterator, a value sent in, Python 3.15's form) is
Dynamo's own. It reads Dynamo's private exception state (``exn_vt_stack._current_exception``),
the same in 2.11 and 2.13.
"""

from __future__ import annotations

import dis
import sys

from torch._dynamo.exc import ObservedUserStopIteration
from torch._dynamo.symbolic_convert import InliningGeneratorInstructionTranslator as _Generator
from torch._dynamo.variables import ConstantVariable
from torch._dynamo.variables.functions import LocalGeneratorObjectVariable

from .compat import DYNAMO_DROPS_YIELD_FROM_RETURN

_SEND_OPCODE = dis.opmap["SEND"]
_DYNAMO_SEND = _Generator.SEND


def _send(self, inst) -> None:
    """``SEND`` of ``None`` to an inlined generator: its next value, or its return value and
    a jump past the loop, as CPython's ``SEND``; any other ``SEND`` is Dynamo's."""
    receiver, sent = self.stack[-2:]
    if sys.version_info >= (3, 15) or not isinstance(receiver, LocalGeneratorObjectVariable) \
            or not sent.is_constant_none():
        return _DYNAMO_SEND(self, inst)
    exceptions = self.exn_vt_stack
    before = exceptions._current_exception
    exceptions._current_exception = None
    try:
        value = receiver.next_variable(self)
    except ObservedUserStopIteration:
        ended = exceptions._current_exception
        value = ended.args[0] if ended is not None and ended.args else ConstantVariable.create(None)
        exceptions._current_exception = before
        self.pop()  # the value sent
        if sys.version_info < (3, 12):
            self.pop()  # the sub-generator (3.12 and later: END_SEND pops it)
        self.push(value)
        self.jump(inst)
        return None
    exceptions._current_exception = before
    self.pop()
    self.push(value)
    return None


def install(enabled: bool) -> None:
    """Pass (``enabled``) or stop passing a sub-generator's return value through ``yield from``;
    a no-op on the versions whose Dynamo passes it itself."""
    if not DYNAMO_DROPS_YIELD_FROM_RETURN:
        return
    handler = _send if enabled else _DYNAMO_SEND
    _Generator.SEND = handler
    # Dynamo dispatches bytecodes by a table each translator class builds when it is defined
    _Generator.dispatch_table[_SEND_OPCODE] = handler


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _Generator.dispatch_table[_SEND_OPCODE] is _send

"""Rank agreement: the ranks of a process group check, before compiling a step graph
whose collectives they will run together, that they are about to run the same thing
(:mod:`.fingerprint`); and a compiled step whose collectives fail
says so in this package's name.

The exchange goes through the process group's key-value store (the ``init_process_group``
store), not through a collective: it works the same on gloo and NCCL, needs no device
memory, and waits with its own timeout (``MUON_COMPILE_AGREE_TIMEOUT``), so a rank that
never arrives is reported by rank instead of hanging a collective.

Algorithm, per compilation, for every process group of the fingerprint at once:
  1. Each rank writes the digest of its facts under ``<group>/<n>/digest/<rank>``, where
     ``n`` counts this process's exchanges on that group (the same on every rank while
     they compile the same graphs; a second backend call for one compilation, Dynamo's
     restart, does not count); the group's first rank also writes its facts.
  2. Each rank waits for the first rank's digest and compares it with its own; a rank
     that differs writes its facts and counts itself in ``differs``. The last rank to
     arrive (a store counter) writes ``done``.
  3. Each rank waits for ``done``. No difference: compile. Otherwise every rank reads the
     first rank's facts and those of the differing ranks, finds the first difference
     (:func:`first_difference`) and raises the same :class:`RankDivergenceError`.
  A rank whose wait times out raises :class:`RankDivergenceError` naming the ranks that
  did not arrive.

On the fast path a rank makes about 6 store requests per group, waits included, whatever
the world size; its cost is in docs/benchmarks.md ("Rank agreement").
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as dist

from ...diagnostics.counters import pass_seconds

log = logging.getLogger(__name__)

# Facts travel as [kind, key, value] lists (fingerprint.Fact).
FactList = Sequence[Sequence[str]]

_TRACED_APART = "The ranks traced different step graphs (different shapes, parameters or param groups)."
_HINTS = {
    "version": "Install the same torch and muon_compile on every rank.",
    "setting": "Set it the same on every rank (or unset it on every rank).",
    "gradient": (
        "Every rank must step the same parameters: give the parameter a gradient on every rank "
        "(zeros where it took no part in the loss) or on none."
    ),
    "plan": _TRACED_APART,
    "collective": _TRACED_APART,
}


class RankDivergenceError(RuntimeError):
    """The ranks of a process group disagree about a compiled optimizer step, or a rank
    did not reach the same compilation, or the compiled step's collectives failed."""


def first_difference(reports: Sequence[tuple[int, FactList]]) -> str | None:
    """The first fact on which a rank differs from the first report's rank, as a sentence
    ("MUON_COMPILE_BUCKET_MB is 64 on rank 0 and 0.0005 on rank 1"), followed by what to
    do; None when all reports agree. Facts are compared by key, in the first report's
    order, then the keys only another rank has; ranks in the order given."""
    (ref_rank, ref_facts), others = reports[0], reports[1:]
    ref = {key: (kind, value) for kind, key, value in ref_facts}
    for kind, key, ref_value in ref_facts:
        for rank, facts in others:
            value = next((v for _, k, v in facts if k == key), None)
            if value != ref_value:
                return _sentence(kind, key, ref_rank, ref_value, rank, value)
    for rank, facts in others:
        for kind, key, value in facts:
            if key not in ref:
                return _sentence(kind, key, ref_rank, None, rank, value)
    return None


def _sentence(kind: str, key: str, ref_rank: int, ref_value: str | None, rank: int, value: str | None) -> str:
    if kind == "gradient":
        if value is None:
            text = f"rank {rank} has no gradient for `{ref_value}`; rank {ref_rank} has one"
        else:
            text = f"rank {rank} has a gradient for `{value}`; rank {ref_rank} has none"
    elif value is None:
        text = f"rank {ref_rank} has {key} ({ref_value}); rank {rank} has none"
    elif ref_value is None:
        text = f"rank {rank} has {key} ({value}); rank {ref_rank} has none"
    elif kind in ("setting", "version"):
        text = f"{key} is {ref_value} on rank {ref_rank} and {value} on rank {rank}"
    else:
        text = f"{key} differs: rank {ref_rank} has {ref_value}; rank {rank} has {value}"
    return f"{text}. {_HINTS[kind]}"


# Exchanges made per process group (the n of step 1), and the compilation each group last
# agreed on (see agree's ``compilation``); both for the store they were made through,
# held so that a new process group (a new store) starts again from 0.
_exchanges: dict[str, itertools.count] = defaultdict(itertools.count)
_agreed: dict[str, object] = {}
_store: list = [None]


def _default_store() -> dist.Store:
    store = dist.distributed_c10d._get_default_store()
    if store is not _store[0]:
        _exchanges.clear()
        _agreed.clear()
        _store[0] = store
    return store


class _Exchange:
    """One group's exchange (steps 1-3 of the module docstring)."""

    def __init__(self, group_name: str, facts: FactList, timeout: float) -> None:
        self.name = group_name
        self.timeout = timeout
        group = dist.distributed_c10d._resolve_process_group(group_name)
        self.ranks = dist.get_process_group_ranks(group)
        self.me = dist.get_rank()
        self.n = next(_exchanges[group_name])
        self.store = dist.PrefixStore(f"muon_compile/agree/{group_name}/{self.n}/", _default_store())
        self.facts = [list(f) for f in facts]
        self.digest = hashlib.sha256(json.dumps(self.facts).encode()).hexdigest()

    @property
    def ref(self) -> int:
        return self.ranks[0]

    def publish(self) -> None:
        self.store.set(f"digest/{self.me}", self.digest)
        if self.me == self.ref:
            self.store.set(f"facts/{self.me}", json.dumps(self.facts))

    def compare(self, deadline: float) -> None:
        self._wait([f"digest/{self.ref}"], deadline)
        if self.store.get(f"digest/{self.ref}").decode() != self.digest:
            self.store.set(f"facts/{self.me}", json.dumps(self.facts))
            self.store.add("differs", 1)
        if self.store.add("arrived", 1) == len(self.ranks):
            self.store.set("done", "1")

    def conclude(self, deadline: float) -> None:
        self._wait(["done"], deadline)
        if self.store.add("differs", 0) == 0:
            return
        reports = [(r, json.loads(self.store.get(f"facts/{r}"))) for r in self.ranks if self._has(f"facts/{r}")]
        difference = first_difference(reports) or "their facts hash differently"
        raise RankDivergenceError(
            f"muon_compile: the ranks of process group {self.name!r} ({len(self.ranks)} ranks) disagree about "
            f"the optimizer step they are compiling: {difference}"
        )

    def _has(self, key: str) -> bool:
        return self.store.check([key])

    def _wait(self, keys: list[str], deadline: float) -> None:
        try:
            self.store.wait(keys, datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        except RuntimeError:  # the store's timeout error (DistStoreError, a RuntimeError)
            missing = [r for r in self.ranks if not self._has(f"digest/{r}")]
            raise RankDivergenceError(
                f"muon_compile: rank {self.me} is compiling a step graph with collectives on process group "
                f"{self.name!r} ({len(self.ranks)} ranks) and waited "
                f"{self.timeout:g} s (MUON_COMPILE_AGREE_TIMEOUT) for the other ranks to compile the same: "
                f"rank(s) {missing} did not. "
                "The ranks of a group must compile the same graphs at the same point: a graph recompiled on "
                "some ranks only (a guard failing on one rank), a step skipped or a rank stopped elsewhere."
            ) from None


def agree(groups: dict[str, FactList], timeout: float, compilation: object = None) -> None:
    """Check that the ranks of every process group in ``groups`` (name -> this rank's
    facts) hold the same facts; raise :class:`RankDivergenceError` otherwise, or when a
    rank does not arrive within ``timeout`` seconds. Does nothing under the fake process
    group or with ``timeout`` 0. Its time adds to ``pass_seconds["rank_agreement"]``.

    ``compilation`` identifies the compilation (Dynamo's compile id): a group that already
    agreed on it is not asked again. Dynamo calls the backend a second time for one
    compilation when it restarts its analysis, which a cold Inductor compile may make it
    do and a cached one does not: counting that call would put the ranks' exchange
    numbers out of step."""
    if timeout <= 0 or not dist.is_initialized() or dist.get_backend() == "fake":
        return
    start = time.monotonic()
    deadline = start + timeout
    _default_store()
    todo = {n: f for n, f in groups.items() if compilation is None or _agreed.get(n) != compilation}
    exchanges = [_Exchange(name, facts, timeout) for name, facts in todo.items()]
    for e in exchanges:  # every rank writes before any waits: no order between groups to deadlock on
        e.publish()
    for e in exchanges:
        e.compare(deadline)
    for e in exchanges:
        e.conclude(deadline)
        _agreed[e.name] = compilation
    pass_seconds["rank_agreement"] += time.monotonic() - start
    log.debug("ranks agree on %d process group(s) in %.4f s", len(exchanges), time.monotonic() - start)


def failing(error: RankDivergenceError) -> Callable:
    """A compiled step that raises ``error`` (a new instance, same text) on every call.

    The backend returns it instead of raising: Dynamo would wrap an error raised while
    compiling in its own ``BackendCompilerFailed``, while this reaches the caller as a
    :class:`RankDivergenceError`, on every rank, at the first call of the step."""

    def run(*args: Any) -> Any:
        raise RankDivergenceError(str(error))

    return run


def guard_collectives(compiled: Callable, groups: Sequence[str]) -> Callable:
    """``compiled`` (a compiled step graph with collectives on ``groups``), raising a
    :class:`RankDivergenceError` that names this package and the likely cause when it
    fails with a ``RuntimeError`` (a collective's timeout or a closed connection when
    the ranks diverged after compiling), the original error chained."""

    def run(*args: Any) -> Any:
        try:
            return compiled(*args)
        except RuntimeError as e:
            raise RankDivergenceError(
                f"muon_compile: the compiled optimizer step failed on rank {dist.get_rank()} while it "
                f"communicates over process group(s) {list(groups)}: {e}\nIf that is a collective's timeout "
                "or a closed connection, the ranks diverged after compiling (a rank skipped the step, "
                "recompiled alone or stopped): the process group's timeout (init_process_group(timeout=...)) "
                "bounds the wait."
            ) from e

    run._boxed_call = getattr(compiled, "_boxed_call", False)  # type: ignore[attr-defined]
    return run

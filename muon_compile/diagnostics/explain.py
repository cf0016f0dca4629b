"""What the backend did with each graph it compiled, for a user whose step is not faster.

For every graph: each Newton–Schulz-like loop found (the user's file and line, taken from
the FX node's stack trace), recognised with its arguments or left as it was with the
reason, the bucket and distribution plans, and what Dynamo recorded for the step: the
graph breaks it met while tracing this graph (Dynamo compiles the graph traced so far
when it meets one, so the graph ends there), where the step is split around this graph
(:mod:`muon_compile.diagnostics.splits`: a recognised loop alone in its graph is reported "recognised,
not bucketed: the step is split by <reason> at <file>:<line>") and the reason this graph is
a recompile.

* ``MUON_COMPILE_EXPLAIN=1`` prints each :class:`GraphReport` as its graph compiles.
* :func:`explain` (a notebook) runs a step compiled with ``backend="muon"`` once and
  returns the reports of the graphs it compiled.
* :func:`reports` holds the reports of the last graphs compiled in this process.

The backend also warns, once per hyper-parameter, when Dynamo recompiles a step because a
Python float in ``param_groups`` changed, as often as shows it recompiles at every change
(once on torch 2.11, twice from 2.13, which recompile once and then take the number as an
input): an lr scheduler changes it every step, and after
``torch._dynamo.config.recompile_limit`` recompiles Dynamo runs the step eagerly, silently. It warns, once per process, when a CUDA graph is
requested for a step whose tensors are not on CUDA (:func:`warn_cuda_graph_off_cuda`), or
turned off for a CUDA step that writes 0-D CPU tensors (:func:`warn_cuda_graph_cpu_scalars`;
the decision is :mod:`muon_compile.compile.cuda_graphs`').
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx

from ..compile.compat import DYNAMO_SPECIALIZES_FLOATS, recompile_reason
from .splits import splits

_KEPT = 64  # reports kept for :func:`reports`


@dataclasses.dataclass(frozen=True)
class LoopReport:
    """One loop that formed a Gram matrix: where it is and what became of it."""

    where: str  # "file.py:12 in fn"
    recognised: bool
    detail: str  # the op's arguments, or the reason it was left as it was


@dataclasses.dataclass
class GraphReport:
    """What the backend did with one graph (filled in as its passes run)."""

    compile_id: str
    recompile_reason: str | None = None
    graph_breaks: list[str] = dataclasses.field(default_factory=list)  # met while tracing it
    split_by: list[str] = dataclasses.field(default_factory=list)  # where the step is split around it (:mod:`.splits`)
    loops: list[LoopReport] = dataclasses.field(default_factory=list)
    plans: list[str] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"muon_compile: graph {self.compile_id}"]
        if self.recompile_reason:
            lines.append(f"  recompiled because: {self.recompile_reason.splitlines()[0].strip()}")
        for reason in self.graph_breaks:
            lines.append(f"  ends at a graph break: {reason}")
        for split in self.split_by:
            lines.append(f"  the step is split by {split}")
        if not self.loops:
            lines.append("  no Newton–Schulz loop in this graph")
        # a recognised loop alone in a graph of a split step: nothing to bucket it with
        alone = self.split_by and sum(loop.recognised for loop in self.loops) == 1
        for loop in self.loops:
            verdict = "recognised" if loop.recognised else "NOT recognised"
            if loop.recognised and alone:
                verdict = f"recognised, not bucketed: the step is split by {'; '.join(self.split_by)}"
            lines.append(f"  loop at {loop.where}: {verdict}: {loop.detail}")
        for plan in self.plans:
            lines += ["  " + line for line in plan.splitlines()]
        return "\n".join(lines)


_reports: collections.deque[GraphReport] = collections.deque(maxlen=_KEPT)
_made = 0  # reports made in this process (``_reports`` keeps the last _KEPT)
_current: GraphReport | None = None
_breaks_seen: collections.Counter[str] = collections.Counter()
# recompiles caused by a changed Python number, by (Dynamo's frame id, hyper-parameter): counted
# per compiled frame (a frame's first compile starts its count again, as Dynamo's frame ids
# start again after torch._dynamo.reset())
_float_recompiles: collections.Counter[tuple[int | None, str]] = collections.Counter()


def reports() -> list[GraphReport]:
    """The reports of the last graphs this process compiled with ``backend="muon"``, oldest first."""
    return list(_reports)


@contextlib.contextmanager
def collecting(printing: bool, gm: fx.GraphModule | None = None) -> Iterator[GraphReport]:
    """The report of the graph the backend is about to compile, ``gm`` (printed at the end if ``printing``)."""
    global _current, _made
    report = GraphReport(_compile_id(), recompile_reason(), _new_graph_breaks(), splits(gm) if gm is not None else [])
    _warn_float_hyperparameter(report.recompile_reason, torch._guards.CompileContext.current_compile_id())
    _current = report
    try:
        yield report
    finally:
        _current = None
        _reports.append(report)
        _made += 1
        if printing:
            print(report, flush=True)


def note_loop(node: fx.Node, recognised: bool, detail: str) -> None:
    """Record a loop of the graph being compiled (a no-op outside :func:`collecting`)."""
    if _current is not None:
        _current.loops.append(LoopReport(source_line(node), recognised, detail))


def note_plan(text: str) -> None:
    """Record a plan (buckets, distribution) of the graph being compiled."""
    if _current is not None and text:
        _current.plans.append(text)


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[GraphReport]:
    """Run ``torch.compile(fn, backend="muon")(*args, **kwargs)`` once (it really runs: an
    optimizer step takes a step) and return the reports of the graphs that compiled.
    ``print`` each report, or the list, to read it. It starts with ``torch._dynamo.reset()``
    so that ``fn`` compiles afresh: code compiled earlier in the process compiles again
    on its next call."""
    torch._dynamo.reset()
    before = _made
    _new_graph_breaks()
    torch.compile(fn, backend="muon")(*args, **kwargs)
    found = list(_reports)[-(_made - before):] if _made > before else []
    leftover = _new_graph_breaks()  # breaks in code that made no graph
    if leftover and found:
        found[-1].graph_breaks += [f"(after this graph) {b}" for b in leftover]
    return found


def source_line(node: fx.Node) -> str:
    """``file:line in function`` of the user code that made ``node`` (the innermost frame of
    its stack trace), or its name when it has none."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', trace)
    if not frames:
        return f"node {node.name}"
    path, line, fn = frames[-1]
    return f"{path}:{line} in {fn}"


def _compile_id() -> str:
    cid = torch._guards.CompileContext.current_compile_id()
    return f"[{cid.frame_id}/{cid.frame_compile_id}]" if cid is not None else "[?]"


def _new_graph_breaks() -> list[str]:
    """The first line of each graph break Dynamo recorded since the previous call."""
    from torch._dynamo.utils import counters

    now = collections.Counter(counters["graph_break"])
    new = now - _breaks_seen
    _breaks_seen.clear()
    _breaks_seen.update(now)
    return [reason.splitlines()[0] for reason in new.elements()]


_PARAM_GROUP_KEY = re.compile(r"param_groups\[(\d+)\]\[['\"](\w+)['\"]\]")


def _warn_float_hyperparameter(reason: str | None, cid: torch._guards.CompileId | None) -> None:
    """Warn once per compiled frame (``cid``'s) and hyper-parameter at the recompile caused by
    a changed Python number in an optimizer's ``param_groups`` that shows it recompiles at every
    change: the first where Dynamo specialises floats (``compat.DYNAMO_SPECIALIZES_FLOATS``),
    else the second (torch 2.13 and later recompile once, then take the number as an input)."""
    frame = cid.frame_id if cid is not None else None
    if cid is not None and cid.frame_compile_id == 0:  # a frame compiled for the first time
        for counted in [k for k in _float_recompiles if k[0] == frame]:
            del _float_recompiles[counted]
    match = _PARAM_GROUP_KEY.search(reason or "")
    if match is None or not re.search(r"==\s*-?[\d.]+(e-?\d+)?", reason):
        return
    key = match.group(2)
    _float_recompiles[frame, key] += 1
    if _float_recompiles[frame, key] != (1 if DYNAMO_SPECIALIZES_FLOATS else 2):
        return
    times = "once" if DYNAMO_SPECIALIZES_FLOATS else "twice"
    warnings.warn(
        f"muon_compile: the optimizer step was recompiled {times} because param_groups[{match.group(1)}]['{key}'] "
        f"is a Python number that changed (a scheduler changes it every step). Each change "
        f"recompiles, and after torch._dynamo.config.recompile_limit recompiles the step runs eagerly. "
        f"Give it as a tensor instead, e.g. {key}=torch.tensor(0.02), and update it in place "
        f"(LR schedulers do so for a tensor lr).",
        stacklevel=2,
    )


def warn_symbolic_shapes(sites: list[str]) -> None:
    """Warn that the Newton–Schulz ops of ``sites`` (their input shapes, as text) were
    traced with symbolic shapes, so the passes leave them as the op, and name the fix."""
    warnings.warn(
        f"muon_compile: Dynamo traced this optimizer step with dynamic shapes, as it does once the same code was "
        f"compiled for other shapes (another optimizer's step, say); {len(sites)} Newton–Schulz op(s) have symbolic "
        f"shapes ({', '.join(sites)}) and run as the op's own kernel: not bucketed, distributed or lowered. "
        f'Compile the step with torch.compile(step, backend="muon", dynamic=False) to keep its shapes static.',
        stacklevel=2,
    )


_warned: set[str] = set()  # the once-per-process warnings given so far


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


def warn_cuda_graph_off_cuda(devices: list[str]) -> None:
    """Warn, once per process, that a CUDA graph was asked for (``mode="reduce-overhead"``
    or ``options={"triton.cudagraphs": True}``) by a step whose tensors are not on CUDA."""
    _warn_once(
        "cuda_graph_off_cuda",
        f"muon_compile: a CUDA graph was requested (mode='reduce-overhead' or triton.cudagraphs) for an optimizer "
        f"step whose tensors are on {', '.join(devices)}, not CUDA; the step is compiled and runs without one.",
    )


def warn_cuda_graph_cpu_scalars(blocking: list[str]) -> None:
    """Warn, once per process, that a CUDA graph asked for by a step on CUDA was turned off
    because the step writes (or returns) the 0-D CPU tensors named in ``blocking``
    (:mod:`muon_compile.compile.cuda_graphs`)."""
    _warn_once(
        "cuda_graph_cpu_scalars",
        f"muon_compile: a CUDA graph was requested (mode='reduce-overhead' or triton.cudagraphs), and this step "
        f"writes or returns 0-D CPU tensors ({', '.join(blocking)}; a step counter kept on the CPU, say): a "
        f"replayed graph cannot update them on the host. The step is compiled without a CUDA graph. Keep such "
        f"tensors on the parameters' device (torch.optim's capturable=True does so for its step counts).",
    )

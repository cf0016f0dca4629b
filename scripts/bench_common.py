"""What the benchmarks share: the machine they ran on, timing a step, measuring an arm, table cells.

Machine: :func:`machine_info` collects the CPU model (``lscpu``'s "Model name", else
``platform.processor()``), ``os.cpu_count()``, the torch version and
``torch.get_num_threads()``, and on CUDA the GPU's name and the CUDA version;
:func:`machine_line` prints it as a report's ``machine:`` line.

Timing: a :class:`Clock` times a call with ``time.perf_counter`` (on the CPU a call runs
to its end before it returns); a :class:`CudaClock` times a step by a pair of CUDA events
recorded around the call on the current stream (the GPU time from the start of the step's
work to its end, gaps where the GPU waits for the host included) and a first call by the
wall clock up to a ``torch.cuda.synchronize()``. :func:`time_steps` takes ``reps`` timed
steps after ``warmup`` untimed ones and a synchronize, so no timed step overlaps earlier work.

Measuring an arm (:func:`measure`): build its step; for a compiled arm, inside one fresh
Inductor cache directory, compile it cold (after ``torch._dynamo.reset()``) and warm (reset
again: the FX graph cache hits), timing each first call, and count the launches of the cold
compile's generated code (:func:`muon_compile.launches.count_launches`: products, generated
kernels, other op calls); then time the steps on the warm compile, and count the matmul
kernel calls of one more step profiled with ``torch.profiler`` (host-side events named in
:data:`MATMUL_OPERANDS`; not ``aten::matmul``, which dispatches to those). An arm that raises is recorded with its
error (:func:`error_summary`) and the run goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable

import torch
from torch._inductor.utils import fresh_cache, run_and_get_code

from muon_compile.launches import Launches, count_launches

Step = Callable[[], object]

# the matmul ops a step's kernels are counted by, with the positions of their two matrix
# operands in the op's inputs (addmm and baddbmm take the added tensor first)
MATMUL_OPERANDS = {"aten::mm": (0, 1), "aten::bmm": (0, 1), "aten::addmm": (1, 2), "aten::baddbmm": (1, 2)}


# ------------------------------------------------------------------------------ machine
def cpu_model() -> str:
    """The CPU model from ``lscpu`` when available, else ``platform.processor()``."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_info(device: torch.device) -> dict:
    """The host, torch and the device the steps run on; on CUDA also the GPU and the CUDA version."""
    info = {
        "device": device.type,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        info |= {"gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda}
    return info


def machine_line(machine: dict) -> str:
    """The report's 'machine:' line; on CUDA it starts with the device, the GPU and the CUDA version."""
    host = (
        f"{machine['cpu']}, os.cpu_count()={machine['cpu_count']}, torch {machine['torch']}, "
        f"torch.get_num_threads()={machine['threads']}"
    )
    if machine["device"] == "cuda":
        return f"machine: device cuda, {machine['gpu']}, CUDA {machine['cuda']}; host {host}"
    return f"machine: {host}"


# ------------------------------------------------------------------------------- timing
class Clock:
    """Times calls on the CPU: ``time.perf_counter`` around the call, which runs to its end before returning."""

    def synchronize(self) -> None:
        """Wait for all work queued so far (none is left queued on the CPU)."""

    def wall_s(self, fn: Step) -> float:
        """Wall-clock seconds of ``fn()`` from the end of earlier work to the end of its own (first calls: compile times)."""
        self.synchronize()
        start = time.perf_counter()
        fn()
        self.synchronize()
        return time.perf_counter() - start

    def step_s(self, fn: Step) -> float:
        """Seconds of one timed step ``fn()``."""
        return self.wall_s(fn)


class CudaClock(Clock):
    """Times calls on CUDA: steps by a pair of CUDA events around the call, first calls by the
    wall clock up to a ``torch.cuda.synchronize()`` (see the module docstring)."""

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def step_s(self, fn: Step) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds


def clock_for(device: torch.device) -> Clock:
    """The clock that times steps on ``device``."""
    return CudaClock() if device.type == "cuda" else Clock()


def time_steps(step: Step, warmup: int, reps: int, clock: Clock) -> list[float]:
    """Seconds of ``reps`` steps after ``warmup`` untimed ones (and a synchronize)."""
    for _ in range(warmup):
        step()
    clock.synchronize()
    return [clock.step_s(step) for _ in range(reps)]


# ------------------------------------------------------------------------ measuring arms
@dataclasses.dataclass(frozen=True)
class Arm:
    """A way to run the step: ``make_step(workload, device)`` builds it; ``backend`` is the
    torch.compile backend (None: eager)."""

    key: str
    name: str
    make_step: Callable[[object, torch.device], Step]
    backend: str | None = None


@dataclasses.dataclass
class ArmResult:
    """What was measured of one arm; fields stay None where not measured (or the arm failed first)."""

    key: str
    name: str
    times_s: list[float] | None = None
    cold_compile_s: float | None = None
    warm_compile_s: float | None = None
    matmul_calls: int | None = None
    launches: Launches | None = None
    error: str | None = None

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.times_s) if self.times_s else None

    @property
    def min_s(self) -> float | None:
        return min(self.times_s) if self.times_s else None


def count_matmul_calls(step: Step, clock: Clock) -> int:
    """Matmul kernel calls (:data:`MATMUL_OPERANDS` profiler events, recorded on the host) of one step."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
        clock.synchronize()
    return sum(1 for event in prof.events() if event.name in MATMUL_OPERANDS)


def compile_cold_then_warm(step: Step, backend: str, result: ArmResult, clock: Clock) -> Step:
    """Compile ``step`` twice (cold, then warm from the FX graph cache), timing each first
    call; the cold compile's generated code gives ``result.launches``."""
    torch._dynamo.reset()
    cold = torch.compile(step, backend=backend)
    code: list[str] = []
    result.cold_compile_s = clock.wall_s(lambda: code.extend(run_and_get_code(cold)[1]))
    result.launches = count_launches(code)
    torch._dynamo.reset()
    compiled = torch.compile(step, backend=backend)
    result.warm_compile_s = clock.wall_s(compiled)
    return compiled


def error_summary(exc: BaseException, limit: int | None = None) -> str:
    """``Type: first line of the message`` (compiler errors run to many lines), that line
    cut to ``limit`` characters when given."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:limit]}" if lines else type(exc).__name__


def measure(arm: Arm, workload: object, device: torch.device, warmup: int, reps: int) -> ArmResult:
    """Run one arm on ``workload`` (whatever its ``make_step`` takes) on ``device`` (see the
    module docstring); an exception is recorded in the result, not raised."""
    result = ArmResult(arm.key, arm.name)
    clock = clock_for(device)
    cache = fresh_cache() if arm.backend is not None else contextlib.nullcontext()
    try:
        with torch.no_grad(), cache:
            torch._dynamo.reset()
            step = arm.make_step(workload, device)
            if arm.backend is not None:
                step = compile_cold_then_warm(step, arm.backend, result, clock)
            result.times_s = time_steps(step, warmup, reps, clock)
            result.matmul_calls = count_matmul_calls(step, clock)
    except Exception as exc:  # keep going: report the arm as failed
        traceback.print_exc(file=sys.stderr)
        result.error = error_summary(exc)
    finally:
        torch._dynamo.reset()
    return result


# -------------------------------------------------------------------------- tables, CLI
def cell(value: float | int | None, spec: str, suffix: str = "") -> str:
    """``value`` formatted by ``spec`` (and ``suffix``), or '-' where there is none."""
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown_row(cells: Iterable[str]) -> str:
    """``| a | b |``"""
    return "| " + " | ".join(cells) + " |"


def markdown_rule(aligns: str) -> str:
    """The line under a markdown table's header: one column per letter of ``aligns``,
    ``l`` left-aligned, ``r`` right-aligned (``|---|---:|``)."""
    return "|" + "|".join("---:" if a == "r" else "---" for a in aligns) + "|"


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value

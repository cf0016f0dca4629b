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
compile's generated code (:func:`muon_compile.diagnostics.launches.count_launches`: products, generated
kernels, other op calls); then time the steps on the warm compile, and count the matmul
kernel calls of one more step profiled with ``torch.profiler`` (host-side events named in
:data:`MATMUL_OPERANDS`; not ``aten::matmul``, which dispatches to those), the time of its
kernels by kind (:func:`kernel_kind`) and the costliest of those besides the products: on
CUDA the GPU kernels that step ran (the profiler's CUDA events: kernels, copies and fills),
on the CPU the outermost calls of a known kind (aten's matmuls, copies and ``foreach``
calls, this package's ops, and Inductor's C++ kernels, which it compiles with
``cpp.enable_kernel_profile`` to name them in the profile). An arm that raises is recorded
with its error (:func:`error_summary`) and the run goes on.

Compiling in parallel (:func:`compile_in_parallel`): the cold compiles of many arms run at
once, each in a process of its own (``spawn``), all in one Inductor cache directory with the
FX graph cache on; :func:`measure` then takes the cold compile's seconds and launches from
that process and compiles the arm once more itself, warm (the FX graph cache hits), before
timing its steps one arm at a time; an arm whose compile process failed compiles in the
measuring process instead. A cold compile timed beside others shares the host's cores with
them: on a host with fewer cores than compiles at once it reads high.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import multiprocessing
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch._inductor.utils import fresh_cache, run_and_get_code

import muon_compile.config
from muon_compile.compile import cpu_heap
from muon_compile.diagnostics.launches import Launches, count_launches

Step = Callable[[], object]

# the matmul ops a step's kernels are counted by, with the positions of their two matrix
# operands in the op's inputs (addmm and baddbmm take the added tensor first)
MATMUL_OPERANDS = {"aten::mm": (0, 1), "aten::bmm": (0, 1), "aten::addmm": (1, 2), "aten::baddbmm": (1, 2)}

# The kinds of a profiled step's kernels, by name, the first pattern that matches: products
# (cuBLAS and cuBLASLt: ``nvjet_*``, ``sm90_xmma_gemm_*``, CUTLASS; Inductor's Triton matmul
# templates; muon_compile's symmetric product; on the CPU aten's matmul calls), the kernels
# Inductor generated (its Triton pointwise, reduction and persistent kernels; its C++ kernels,
# ``graph_<n>_cpp_fused_*``), torch's multi-tensor (``_foreach_*``) kernels and the stacked
# write, copies, casts and fills (``Memcpy``/``Memset``, ``torch.cat``/``stack``, ``.to``,
# ``fill_``; on the CPU ``aten::copy_`` and the gather op), collectives (NCCL, gloo), and
# ``other`` (on CUDA aten's own elementwise and reduction kernels; on the CPU not counted).
KINDS = (
    ("products", re.compile(r"gemm|nvjet|cutlass|xmma|triton_tem_|sym_bmm|^aten::(mm|bmm|addmm|baddbmm)$", re.IGNORECASE)),
    ("generated", re.compile(r"^triton_|^graph_\d+_cpp_")),
    ("writes", re.compile(r"multi_tensor_apply|foreach|_scale_add_kernel|unstack_scale_add_", re.IGNORECASE)),
    ("copies", re.compile(
        r"memcpy|memset|CatArrayBatchedCopy|copy_kernel|FillFunctor|^aten::(copy_|stack|cat|fill_|zero_)$|^muon_compile::stack$",
        re.IGNORECASE,
    )),
    ("collectives", re.compile(r"nccl|^gloo:", re.IGNORECASE)),
)
OTHER_KIND = "other"
KERNEL_KINDS = tuple(kind for kind, _ in KINDS) + (OTHER_KIND,)
TOP_KERNELS = 5  # the costliest kernels besides the products a profiled step reports


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
    """The host, torch and the device the steps run on; on CUDA also the GPU and the CUDA version.

    On the CPU it first makes the process's heap keep freed memory as the ``muon`` backend's
    first CPU compile would (:mod:`muon_compile.compile.cpu_heap`; the process's, so every arm of the
    run steps with it, eager and Inductor arms included, and none is timed before and another
    after): ``cpu_heap_mib`` is what it keeps, 0 with ``MUON_COMPILE_CPU_HEAP_MB=0`` (glibc's
    settings for every arm)."""
    info = {
        "device": device.type,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    if device.type == "cpu":
        info["cpu_heap_mib"] = cpu_heap.keep(muon_compile.config.current().cpu_heap_mb)
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
    heap = machine.get("cpu_heap_mib")
    heap = f"; CPU heap keeps {heap} MiB freed" if heap else "; CPU heap: glibc's settings"
    return f"machine: {host}{heap}"


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
    return time_in_turn({"step": step}, warmup, reps, clock)["step"]


def time_in_turn(steps: dict[str, Step], warmup: int, reps: int, clock: Clock) -> dict[str, list[float]]:
    """Seconds of ``reps`` rounds in which every step of ``steps`` runs once, in turn, after
    ``warmup`` untimed rounds: drift of the machine and the allocator's state (on the CPU a
    step that follows another finds the heap that one left) fall on every step alike."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    clock.synchronize()
    times: dict[str, list[float]] = {key: [] for key in steps}
    for _ in range(reps):
        for key, step in steps.items():
            times[key].append(clock.step_s(step))
    return times


def steps_in_turn(arms: Iterable[Arm], workload: object, device: torch.device, warmup: int, reps: int) -> dict[str, list[float]]:
    """Each arm's step built afresh and compiled (in one fresh Inductor cache, no Dynamo reset
    between arms, so every compiled step stays live), then timed by :func:`time_in_turn`:
    ``{arm key: seconds}``; an arm that fails to build or compile is left out."""
    clock, steps = clock_for(device), {}
    with torch.no_grad(), kernels_profiled(device), fresh_cache():
        torch._dynamo.reset()
        for arm in arms:
            try:
                step = arm.make_step(workload, device)
                step = arm.compile(step) if arm.backend is not None else step
                step()
                steps[arm.key] = step
            except Exception:  # measure() reports the arm's error
                traceback.print_exc(file=sys.stderr)
        try:
            return time_in_turn(steps, warmup, reps, clock)
        finally:
            torch._dynamo.reset()


# ------------------------------------------------------------------------ measuring arms
@dataclasses.dataclass(frozen=True)
class Arm:
    """A way to run the step: ``make_step(workload, device)`` builds it; ``backend`` is the
    torch.compile backend (None: eager), ``options`` its ``torch.compile(options=...)``,
    ``settings`` the ``muon_compile.config`` fields in force while it compiles and runs."""

    key: str
    name: str
    make_step: Callable[[object, torch.device], Step]
    backend: str | None = None
    options: dict | None = None
    settings: dict | None = None

    def compile(self, step: Step) -> Step:
        compiled = torch.compile(step, backend=self.backend, options=self.options)
        if not self.settings:
            return compiled

        def with_settings() -> object:
            from muon_compile import config

            with config.override(**self.settings):
                return compiled()

        return with_settings


@dataclasses.dataclass
class ArmResult:
    """What was measured of one arm; fields stay None where not measured (or the arm failed first)."""

    key: str
    name: str
    times_s: list[float] | None = None
    cold_compile_s: float | None = None
    warm_compile_s: float | None = None
    matmul_calls: int | None = None
    gpu_kernels: int | None = None
    kernel_ms: dict[str, float] | None = None
    top_kernels: tuple[tuple[str, float, int], ...] | None = None
    launches: Launches | None = None
    error: str | None = None

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.times_s) if self.times_s else None

    @property
    def min_s(self) -> float | None:
        return min(self.times_s) if self.times_s else None


def kernel_kind(name: str) -> str:
    """The kind (:data:`KERNEL_KINDS`) of a kernel named ``name`` (:data:`KINDS`)."""
    return next((kind for kind, pattern in KINDS if pattern.search(name)), OTHER_KIND)


@dataclasses.dataclass(frozen=True)
class StepProfile:
    """One profiled step: its matmul calls (host-side :data:`MATMUL_OPERANDS` events), on
    CUDA its GPU kernels (None elsewhere), the milliseconds of its kernels by
    :func:`kernel_kind` (every kind, 0 where none ran) and the :data:`TOP_KERNELS`
    costliest kernels besides the products as ``(name, ms, calls)``."""

    matmul_calls: int
    gpu_kernels: int | None = None
    kernel_ms: dict[str, float] | None = None
    top_kernels: tuple[tuple[str, float, int], ...] | None = None


def kernel_time(kernels: Iterable[tuple[str, float]]) -> tuple[dict[str, float], tuple[tuple[str, float, int], ...]]:
    """``(name, microseconds)`` of a step's kernels -> milliseconds by kind, and the
    :data:`TOP_KERNELS` costliest names besides the products (``(name, ms, calls)``)."""
    by_kind = dict.fromkeys(KERNEL_KINDS, 0.0)
    by_name: dict[str, list[float]] = {}
    for name, us in kernels:
        kind = kernel_kind(name)
        by_kind[kind] += us / 1e3
        if kind != "products":
            by_name.setdefault(name, []).append(us / 1e3)
    top = sorted(((name, sum(ms), len(ms)) for name, ms in by_name.items()), key=lambda t: -t[1])
    return by_kind, tuple(top[:TOP_KERNELS])


def outermost_known(events: Iterable) -> list:
    """The host-side profiler events of a known kind (not :data:`OTHER_KIND`) inside no other
    such event: a CPU step's kernels, each counted once (a copy inside the gather op is the op's)."""

    def known(event) -> bool:
        return event.device_type == torch.autograd.DeviceType.CPU and kernel_kind(event.name) != OTHER_KIND

    def inside_known(event) -> bool:
        parent = event.cpu_parent
        while parent is not None:
            if known(parent):
                return True
            parent = parent.cpu_parent
        return False

    return [e for e in events if known(e) and not inside_known(e)]


def kernels_profiled(device: torch.device) -> contextlib.AbstractContextManager:
    """What a compile for ``device`` is made under: on the CPU Inductor's
    ``cpp.enable_kernel_profile``, which names each C++ kernel in the profile (a
    ``RECORD_FUNCTION`` per call, nothing while no profiler runs)."""
    if device.type != "cpu":
        return contextlib.nullcontext()
    import torch._inductor.config as inductor_config

    return inductor_config.patch({"cpp.enable_kernel_profile": True})


def profile_step(step: Step, device: torch.device, clock: Clock, trace: str | None = None) -> StepProfile:
    """Profile one call of ``step`` (see :class:`StepProfile`); with ``trace``, also write the
    profile there as a Chrome trace (``chrome://tracing``, Perfetto)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        step()
        clock.synchronize()
    if trace is not None:
        prof.export_chrome_trace(trace)
    events = prof.events()
    matmuls = sum(1 for event in events if event.name in MATMUL_OPERANDS)
    if device.type == "cuda":
        kernels = [(e.name, e.time_range.elapsed_us()) for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        by_kind, top = kernel_time(kernels)
        return StepProfile(matmuls, len(kernels), by_kind, top)
    by_kind, top = kernel_time((e.name, e.time_range.elapsed_us()) for e in outermost_known(events))
    return StepProfile(matmuls, None, by_kind, top)


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What a cold compile in a process of its own measured (:func:`compile_in_parallel`)."""

    cold_compile_s: float | None = None
    launches: Launches | None = None
    error: str | None = None


def compile_cold(arm: Arm, step: Step, clock: Clock) -> Compiled:
    """Compile ``step`` after ``torch._dynamo.reset()`` and time its first call; the
    generated code gives the launches."""
    torch._dynamo.reset()
    compiled = arm.compile(step)
    code: list[str] = []
    seconds = clock.wall_s(lambda: code.extend(run_and_get_code(compiled)[1]))
    return Compiled(seconds, count_launches(code))


def compile_warm(arm: Arm, step: Step, result: ArmResult, clock: Clock) -> Step:
    """Compile ``step`` again after ``torch._dynamo.reset()`` (the FX graph cache hits) and
    time its first call."""
    torch._dynamo.reset()
    compiled = arm.compile(step)
    result.warm_compile_s = clock.wall_s(compiled)
    return compiled


def python_312_typing() -> None:
    """Give ``typing`` Python 3.12's ``override`` decorator (from ``typing_extensions``) where it
    lacks it: NVIDIA Emerging-Optimizers imports it and needs nothing else of 3.12 (it marks a
    method and does nothing at run time)."""
    import typing

    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override


def error_summary(exc: BaseException, limit: int | None = None) -> str:
    """``Type: first line of the message`` (compiler errors run to many lines), that line
    cut to ``limit`` characters when given."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:limit]}" if lines else type(exc).__name__


def measure(
    arm: Arm,
    workload: object,
    device: torch.device,
    warmup: int,
    reps: int,
    compiled: Compiled | None = None,
    trace: str | None = None,
) -> ArmResult:
    """Run one arm on ``workload`` (whatever its ``make_step`` takes) on ``device`` (see the
    module docstring); an exception is recorded in the result, not raised. ``compiled``: the
    arm's cold compile, done already in the current Inductor cache (:func:`compile_in_parallel`);
    where that process failed, the arm compiles here, cold, as without it. ``trace``: a path
    for the profiled step's Chrome trace (:func:`profile_step`)."""
    result = ArmResult(arm.key, arm.name)
    clock = clock_for(device)
    if compiled is not None and compiled.error:
        print(f"{arm.name}: its compile process failed ({compiled.error}); compiling it here", file=sys.stderr)
        compiled = None
    fresh = arm.backend is not None and compiled is None
    try:
        with torch.no_grad(), kernels_profiled(device), fresh_cache() if fresh else contextlib.nullcontext():
            torch._dynamo.reset()
            step = arm.make_step(workload, device)
            if arm.backend is not None:
                compiled = compiled or compile_cold(arm, step, clock)
                result.cold_compile_s, result.launches = compiled.cold_compile_s, compiled.launches
                step = compile_warm(arm, step, result, clock)
            result.times_s = time_steps(step, warmup, reps, clock)
            profiled = profile_step(step, device, clock, trace)
            result.matmul_calls, result.gpu_kernels = profiled.matmul_calls, profiled.gpu_kernels
            result.kernel_ms, result.top_kernels = profiled.kernel_ms, profiled.top_kernels
    except Exception as exc:  # keep going: report the arm as failed
        traceback.print_exc(file=sys.stderr)
        result.error = error_summary(exc)
    finally:
        torch._dynamo.reset()
    return result


def _compile_one(make_arm: Callable[[], tuple[Arm, object]], device_type: str) -> Compiled:
    """In a compile process: build the arm's step and compile it cold (see :func:`compile_in_parallel`)."""
    try:
        arm, workload = make_arm()
        device = torch.device(device_type)
        with torch.no_grad(), kernels_profiled(device):
            return compile_cold(arm, arm.make_step(workload, device), clock_for(device))
    except Exception as exc:  # reported by the arm's measure
        traceback.print_exc(file=sys.stderr)
        return Compiled(error=error_summary(exc))


def compile_in_parallel(jobs: dict, device: torch.device, workers: int) -> dict:
    """``{key: make_arm}`` -> ``{key: Compiled}``: each ``make_arm()`` (a picklable
    callable returning ``(arm, workload)``) built and compiled cold in a process of its own,
    ``workers`` at a time, all in the Inductor cache directory of this process, which must
    be set (``TORCHINDUCTOR_CACHE_DIR``) for :func:`measure` to find their work."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        raise RuntimeError("compile_in_parallel: set TORCHINDUCTOR_CACHE_DIR, the cache the compiles share")
    context = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {key: pool.submit(_compile_one, make_arm, device.type) for key, make_arm in jobs.items()}
        return {key: _result(future) for key, future in futures.items()}


def _result(future: concurrent.futures.Future) -> Compiled:
    """A compile process's result; a process that died (the pool broke) as a failed compile."""
    try:
        return future.result()
    except Exception as exc:  # BrokenProcessPool: the arm compiles in the measuring process instead
        return Compiled(error=error_summary(exc))


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


def kernel_bench_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments every kernel benchmark (bench_sym.py, bench_write.py) takes: ``--device``,
    ``--warmup``, ``--reps`` and ``--json``; the script adds its own."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--warmup", type=positive_int, default=3)
    parser.add_argument("--reps", type=positive_int, default=20)
    parser.add_argument("--json", type=Path)
    return parser


def python_table(points_by_dtype: dict[str, list[tuple[int, float]]]) -> str:
    """``{torch.<dtype>: ((m, value), ...), ...}`` as Python for a ``muon_compile/ns/matmul_rates.py``
    table, from ``(m, value)`` points by dtype name (``"torch.bfloat16"``); dtypes without points left out."""
    parts = [f"{name}: ({', '.join(f'({m}, {v:.3f})' for m, v in points)},)" for name, points in points_by_dtype.items() if points]
    return "{" + ", ".join(parts) + "}"


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value

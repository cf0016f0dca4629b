"""Where a compiled step's time goes on one CPU rank, measured: the split that the cost
model's prediction (``muon_compile.step_cost.StepCost``) is held against.

:func:`split` divides profiled steps' wall time into the self time of their matmuls
(``aten::bmm`` and its kin), of Inductor's generated C++ kernels (named in the profile
only when compiled with ``torch._inductor.config.cpp.enable_kernel_profile``, else part
of the rest) and of their collectives (the ``c10d::`` and ``_c10d_functional::`` calls:
issuing and waiting, barriers left out; the compiled step waits in
``_c10d_functional::wait_tensor``, while an eager ``Work.wait()`` records no event and
falls in the rest), and the rest: guards, the compiled graph's
Python, the runtime wrapper, small ATen calls, what the cost model counts as fixed
costs. Against the prediction: matmul to NS, collectives to exposed communication,
kernels and rest to pointwise work and fixed costs. Only the thread that ran the steps
counts (the one with the most self time); gloo's own threads are left out. Under NCCL
the CPU's self time is not the step's, and nothing here applies.

The profiler adds a little to every recorded call, so the profiled wall time lies above
the step's; the matmuls and collectives are few and long, so their shares hold.
:func:`predicted_split` is the cost model's split of the same step, per rank.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from bench_distributed import MATMUL_OPERANDS

from muon_compile.network_profiles import NetworkProfile
from muon_compile.passes.plan_distributed import DistPlan
from muon_compile.step_cost import DeviceProfile, predict

PARTS = ("wall", "matmul", "kernels", "collectives", "rest")  # measured, seconds per step
PREDICTED = ("total", "NS", "pointwise", "fixed", "exposed")  # the cost model's, seconds per step


def split(events, steps: int, wall: float) -> dict[str, float]:
    """Seconds per step under each of :data:`PARTS` of ``steps`` steps that took ``wall``
    seconds, from their profiler ``events`` (see the module docstring)."""
    by_thread: dict[int, list] = {}
    for e in events:
        by_thread.setdefault(e.thread, []).append(e)
    ran = max(by_thread.values(), key=lambda es: sum(e.self_cpu_time_total for e in es))

    def self_seconds(keep) -> float:
        return sum(e.self_cpu_time_total for e in ran if keep(e.key)) / 1e6 / steps

    parts = {
        "wall": wall / steps,
        "matmul": self_seconds(lambda k: k in MATMUL_OPERANDS),
        "kernels": self_seconds(lambda k: "cpp_fused" in k),
        "collectives": self_seconds(lambda k: k.startswith(("c10d::", "_c10d_functional::")) and "barrier" not in k),
    }
    parts["rest"] = parts["wall"] - parts["matmul"] - parts["kernels"] - parts["collectives"]
    return parts


def labelled(fn, label: str):
    """``fn`` called under a profiler range named ``label``, which :func:`splits_by_label`
    finds again."""

    def call():
        with torch.profiler.record_function(label):
            return fn()

    return call


def _descendants(event) -> list:
    found, stack = [], list(event.cpu_children)
    while stack:
        e = stack.pop()
        found.append(e)
        stack.extend(e.cpu_children)
    return found


def splits_by_label(events, labels: list[str]) -> dict[str, dict[str, float]]:
    """Per label, the :func:`split` of the calls profiled under it (:func:`labelled`):
    each range a step, its duration the step's wall time, the events within it its parts."""
    events = list(events)
    out = {}
    for label in labels:
        ranges = [e for e in events if e.name == label]
        inner = [d for r in ranges for d in _descendants(r)]
        out[label] = split(inner, len(ranges), sum(r.cpu_time_total for r in ranges) / 1e6)
    return out


def profiled_split(step, steps: int) -> dict[str, float]:
    """:func:`split` of ``steps`` calls of ``step`` on this rank, each after a barrier as
    bench_distributed's ``timed`` takes them (the barriers outside the wall time)."""
    wall = 0.0
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            dist.barrier()
            start = time.perf_counter()
            step()
            wall += time.perf_counter() - start
    return split(prof.events(), steps, wall)


def predicted_split(plan: DistPlan, prefetch: int, device: DeviceProfile, network: NetworkProfile) -> list[dict[str, float]]:
    """Per rank, the cost model's seconds of ``plan``'s step at ``prefetch`` under each of
    :data:`PREDICTED`: its total, NS, the memory-bound pointwise work (the step priced
    without the device's fixed costs), the fixed costs (what the full price counts as
    pointwise beyond that) and the exposed communication."""
    cost = predict(plan, prefetch, device, network)
    bare = predict(plan, prefetch, device.without_fixed_costs(), network)
    return [
        {"total": t, "NS": n, "pointwise": b, "fixed": p - b, "exposed": e}
        for t, n, p, b, e in zip(cost.total, cost.ns, cost.pointwise, bare.pointwise, cost.exposed)
    ]

"""Calibrate the advisor to this machine: measure its device and, under torchrun, its
network, and write a profile file (:mod:`muon_compile.advisor.profiles`) that
``python -m muon_compile.advisor --profile FILE`` reads in place of ``--device`` and
``--network``.

    python -m muon_compile.advisor.calibrate --out PROFILE.json [--device cpu|cuda]
        [--max-size 4096] [--max-bytes 16777216] [--reps 5]
    torchrun --nproc-per-node N -m muon_compile.advisor.calibrate --out PROFILE.json [...]

1. Plan the measurements, the same list on every rank (:func:`device_plan`,
   :func:`network_plan`): batched square ``bmm`` in bf16, fp16 and fp32 up to
   ``--max-size`` (:data:`SIZES`, :data:`MAX_SIZE`), a batch of about
   :data:`BATCH_MACS` multiply-adds (on a GPU, to outlast its launch); the bf16 products
   of :data:`muon_compile.ns.matmul_rates.FAMILIES` (``X X^T`` and ``B X`` of a 1:4 ``X``,
   as the Newton–Schulz iteration writes them); on the CPU, single products
   (:data:`CALL_SIZES`) for a call's latency (on a GPU the host's launches are fixed
   costs, below); a copy of :data:`COPY_BYTES`; with more than one rank, each collective
   kind at each of :data:`MESSAGE_BYTES` per rank up to ``--max-bytes`` over the first
   ``g`` ranks, ``g`` every power of two up to the world and the world, called as the
   compiled step calls it (the ``_c10d_functional`` op and its wait).
2. Measure on every rank at once (as a run's ranks compute), in the plan's order: a
   warm-up call, then ``--reps`` timings, each after a barrier, of :data:`CALLS` calls in
   a row (``time.perf_counter``, after ``torch.cuda.synchronize`` on CUDA); the median
   per call, the slowest rank's.
3. Fit: GFLOP/s; a call's latency, its time less its arithmetic at the measured rate (at
   least 0); the copy's bytes/s, read and write counted. Per collective kind, the
   ``Link(latency, bandwidth)`` whose ``steps * latency + factor * bytes / bandwidth``
   (:func:`~muon_compile.advisor.network_profiles.alpha_beta`) has the least squared
   relative error over the sizes and the groups within a node (``LOCAL_WORLD_SIZE``
   ranks), a term that comes out negative dropped; for the groups beyond a node, one
   link over every kind (``inter``; from one node, its all_to_all link: edit it by hand).
4. Rank 0 writes the profiles (:func:`~muon_compile.advisor.profiles.save`) and every
   timing (``measurements``).

Not measured (docs/advisor.md): a compiled step's fixed costs (``step_overhead`` and the
other :data:`~muon_compile.advisor.step_cost.FIXED_COSTS`): the file holds the built-in
``h100`` profile's estimates on CUDA and 0 on the CPU, to edit by hand; the
Newton–Schulz passes' own bandwidth (the copy's stands for it); the CPU share that
gloo's threads take (on a CPU profile a collective holds its ranks' cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist

from ..ns.matmul_rates import FAMILIES, LONG_INNER, MatmulRates, family_product, family_table
from . import profiles
from .network_profiles import COLLECTIVES, Link, NetworkProfile, alpha_beta
from .step_cost import DeviceProfile

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
MAX_SIZE = {"cpu": 1024, "cuda": 4096}
BATCH_MACS = {"cpu": 2**27, "cuda": 2**33}  # a quarter in fp32 on CUDA, 10-20x slower there
MAX_BATCH = {"cpu": 64, "cuda": 65536}
CALL_SIZES = (8, 16, 32, 64, 128, 256)
COPY_BYTES = {"cpu": 64 * 2**20, "cuda": 1024 * 2**20}
MESSAGE_BYTES = tuple(4096 * 4**i for i in range(7))  # 4 KiB to 16 MiB per rank
CALLS = {"matmul": {"cpu": 1, "cuda": 3}, "call": 20, "copy": 3, "collective": 3}
REDUCTIONS = ("all_reduce", "reduce_scatter_tensor")  # sent in fp32, the others in bf16, as the step sends
TIMINGS = ("[matmul, family or call; dtype or family; rows (short side); FLOPs; seconds], [copy; bytes; seconds], "
           "[collective; kind; ranks of the group; bytes a rank; seconds], per call")  # the measurements' rows


class Measurement(NamedTuple):
    """What it measures, ``build`` (the tensors, then the call to time; None on a rank
    outside its group), the calls per timing, the work per call (FLOPs or bytes)."""

    key: tuple
    build: Callable[[], Callable[[], object] | None]
    calls: int
    work: float


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _products(key: tuple, m: int, k: int, n: int, dtype: torch.dtype, device: torch.device, inner: bool = False,
              batch: int = 0) -> Measurement:
    """A batch of ``(m x k) @ (k x n)`` products (with ``inner``, ``X X^T`` of an ``m x k``
    ``X``): ``batch`` matrices, or as many as make :data:`BATCH_MACS` multiply-adds."""
    macs = BATCH_MACS[device.type] // (4 if dtype == torch.float32 and device.type == "cuda" else 1)
    batch = batch or max(1, min(MAX_BATCH[device.type], macs // (m * k * n)))

    def build() -> Callable[[], object]:
        a = torch.randn(batch, m, k, device=device, dtype=dtype)
        b = a.mT if inner else torch.randn(batch, k, n, device=device, dtype=dtype)
        return lambda: torch.bmm(a, b)

    return Measurement(key, build, CALLS["matmul"][device.type], 2.0 * batch * m * k * n)


def device_plan(device: torch.device, max_size: int) -> list[Measurement]:
    """The device's measurements (step 1 of the module docstring)."""
    sizes = [s for s in SIZES if s <= max_size]
    plan = [_products(("matmul", _name(d), s), s, s, s, d, device) for d in DTYPES for s in sizes]
    for f in FAMILIES:
        plan += [_products(("family", f, s), *family_product(f, s), torch.bfloat16, device, f == LONG_INNER) for s in sizes[:-1]]
    if device.type == "cpu":  # one product a call
        calls = [(d, s) for d in DTYPES for s in CALL_SIZES if s <= max_size]
        plan += [_products(("call", _name(d), s), s, s, s, d, device, batch=1)._replace(calls=CALLS["call"]) for d, s in calls]

    def copy() -> Callable[[], object]:
        x = torch.ones(COPY_BYTES[device.type] // 4, device=device)
        y = torch.empty_like(x)
        return lambda: y.copy_(x)

    return [*plan, Measurement(("copy",), copy, CALLS["copy"], 2.0 * COPY_BYTES[device.type])]


def group_sizes(world: int) -> list[int]:
    """Every power of two from 2 up to ``world``, and ``world`` (none for one rank)."""
    return sorted({2**i for i in range(1, world.bit_length())} | {world}) if world > 1 else []


def _collective(kind: str, x: torch.Tensor, size: int, group: str) -> Callable[[], object]:
    """One call of ``kind`` on ``x`` over ``size`` ranks of ``group``, as the compiled step makes it."""
    ops, splits = torch.ops._c10d_functional, [x.numel() // size] * size
    call = {
        "all_gather_into_tensor": lambda: ops.all_gather_into_tensor(x, size, group),
        "all_to_all_single": lambda: ops.all_to_all_single(x, splits, splits, group),
        "all_reduce": lambda: ops.all_reduce(x, "sum", group),
        "reduce_scatter_tensor": lambda: ops.reduce_scatter_tensor(x, "sum", size, group),
    }[kind]
    return lambda: ops.wait_tensor(call())


def network_plan(device: torch.device, max_bytes: int) -> list[Measurement]:
    """The network's measurements (step 1 of the module docstring); every rank creates the groups."""
    world, rank, plan = dist.get_world_size(), dist.get_rank(), []
    for size in group_sizes(world):
        group = dist.group.WORLD if size == world else dist.new_group(list(range(size)))
        name = group.group_name if rank < size else None
        for kind, nbytes in ((k, b) for k in COLLECTIVES for b in MESSAGE_BYTES if b <= max_bytes):
            dtype = torch.float32 if kind in REDUCTIONS else torch.bfloat16
            numel = nbytes // dtype.itemsize // size * size  # an even split over the group

            def build(kind=kind, size=size, name=name, numel=numel, dtype=dtype) -> Callable[[], object] | None:
                return None if name is None else _collective(kind, torch.ones(numel, device=device, dtype=dtype), size, name)

            plan.append(Measurement(("collective", kind, size, numel * dtype.itemsize), build, CALLS["collective"], math.nan))
    return plan


def _clock(device: torch.device) -> float:
    """``time.perf_counter`` once the device's queued work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def seconds(fn: Callable[[], object] | None, calls: int, reps: int, device: torch.device) -> float:
    """Median seconds per call of ``fn`` (step 2 of the module docstring); 0 for None, a
    rank outside the group, which joins the barriers only."""
    if fn is not None:
        fn()  # the warm-up
    times = []
    for _ in range(reps):
        if dist.is_initialized():
            dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)
        if fn is not None:
            start = _clock(device)
            for _ in range(calls):
                fn()
            times.append((_clock(device) - start) / calls)
    return statistics.median(times) if times else 0.0


def measure(plan: list[Measurement], reps: int, device: torch.device) -> list[float]:
    """Seconds per call of each measurement of ``plan``, the slowest rank's."""
    times = [seconds(m.build(), m.calls, reps, device) for m in plan]
    if not dist.is_initialized():
        return times
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist()


def _round(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def _points(values: dict[tuple, float], what: str, name: str) -> list[tuple[int, float]]:
    """``(size, value)`` of the measurements ``(what, name, size)`` of ``values``, in the plan's order."""
    return [(key[2], value) for key, value in values.items() if key[:2] == (what, name)]


def device_profile(plan: list[Measurement], times: list[float], device: torch.device, ranks_per_node: int) -> DeviceProfile:
    """The device profile of the device's measurements (step 3 of the module docstring)."""
    kind, took = device.type, {m.key: t for m, t in zip(plan, times)}
    rate = {m.key: _round(m.work / t / 1e9) for m, t in zip(plan, times)}
    tables = {d: tuple(_points(rate, "matmul", _name(d))) for d in DTYPES}
    families = {f: family_table(f, _points(rate, "family", f)) for f in FAMILIES}
    threads, cores = torch.get_num_threads(), len(os.sched_getaffinity(0))
    what = torch.cuda.get_device_name(device) if kind == "cuda" else f"{cores} cores ({platform.machine()}), {threads} threads a rank"
    source = (f"measured by muon_compile.advisor.calibrate on {datetime.date.today()}: {what}, torch {torch.__version__}, "
              f"{ranks_per_node} rank(s) at once, products up to {max(s for s, _ in tables[torch.bfloat16])} rows; fixed costs "
              f"not measured: {'the h100 profile estimates' if kind == 'cuda' else 'none'}")
    rates = MatmulRates(kind, source, tables, families={f: {torch.bfloat16: t} for f, t in families.items() if t})
    calls = {d: _points(took, "call", _name(d)) for d in DTYPES}
    latency = {d: tuple((s, _round(max(0.0, t - rates.seconds(d, s, s, s)), 3)) for s, t in c) for d, c in calls.items() if c}
    return DeviceProfile(
        f"{kind}-calibrated",
        source,
        dataclasses.replace(rates, latency=latency),
        memory_bandwidth=_round(plan[-1].work / took[plan[-1].key]),  # the plan ends with the copy
        overlaps_communication=kind == "cuda",
        queues_kernels=kind == "cuda",
        **profiles.default_fixed_costs(kind),
        memory=float(torch.cuda.get_device_properties(device).total_memory) if kind == "cuda" else 0.0,
        shared_cores=cores if kind == "cpu" and ranks_per_node * threads > cores else 0,
        rank_threads=threads if kind == "cpu" else 1,
    )


_ROUNDING = 1e-9


def fit_link(points: list[tuple[float, float, float, float]]) -> tuple[Link, float]:
    """The link whose ``steps * latency + factor * bytes / bandwidth`` comes closest to
    ``points`` (``(steps, factor, bytes, seconds)``) in squared relative error (a term
    that comes out negative dropped, the other fitted alone), and its worst relative error."""
    rows = torch.tensor([(s / t, f * b / t) for s, f, b, t in points], dtype=torch.float64)
    ones = torch.ones(len(points), 1, dtype=torch.float64)
    latency, inverse = torch.linalg.lstsq(rows, ones).solution.flatten().tolist()
    # a term is absent where it is negative or, at every point, a share of the time below
    # lstsq's rounding (flat times gave an inverse bandwidth of 1.5e-24, not 0, on torch 2.15)
    if max(s * latency / t for s, _, _, t in points) < _ROUNDING:  # no level at small sizes: bandwidth alone
        latency, inverse = 0.0, torch.linalg.lstsq(rows[:, 1:], ones).solution.item()
    elif max(f * b * inverse / t for _, f, b, t in points) < _ROUNDING:  # no growth with the size: latency alone
        latency, inverse = torch.linalg.lstsq(rows[:, :1], ones).solution.item(), 0.0
    worst = max(abs(s * latency + f * b * inverse - t) / t for s, f, b, t in points)
    return Link(_round(latency), _round(1 / inverse) if inverse > 0 else math.inf), worst


def network_profile(plan: list[Measurement], times: list[float], ranks_per_node: int, backend: str, log) -> NetworkProfile:
    """The network profile of the collectives' measurements (step 3 of the module
    docstring); ``log`` gets a line per link."""
    within: dict[str, list] = {}
    beyond = []
    for (_, kind, size, nbytes), t in zip((m.key for m in plan), times):
        (within.setdefault(kind, []) if size <= ranks_per_node else beyond).append((*alpha_beta(kind, size), nbytes, t))
    kinds = {kind: fit_link(points) for kind, points in within.items()}
    for kind, (link, worst) in kinds.items():
        log(f"{kind}: {link.describe()} (worst fit error {worst:.0%})")
    inter, worst = fit_link(beyond) if beyond else kinds["all_to_all_single"]
    log(f"between nodes: {inter.describe()}" + (f" (worst fit error {worst:.0%})" if beyond else ", not measured: all_to_all's in a node"))
    world, sizes = dist.get_world_size(), sorted({m.key[3] for m in plan})
    source = (f"measured by muon_compile.advisor.calibrate on {datetime.date.today()}: {backend}, world {world}, "
              f"{ranks_per_node} ranks a node, groups of {group_sizes(world)} ranks, {sizes[0]} to {sizes[-1]} bytes per rank; "
              + ("between nodes fitted over the larger groups" if beyond else "between nodes not measured: the all_to_all link"))
    links = {kind: link for kind, (link, _) in kinds.items()}
    return NetworkProfile(f"{backend}-w{world}", source, links.get("all_to_all_single", inter), inter, ranks_per_node, links)


def calibrate(out: str, device: torch.device, max_size: int, max_bytes: int, reps: int, log=print):
    """Measures the device and, in a process group of more than one rank, the network (see
    the module docstring); rank 0 writes the profile file ``out`` and logs. Returns the
    device profile and the network profile (None with one rank)."""
    world, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    log = log if rank == 0 else (lambda *_: None)
    ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    plan = device_plan(device, max_size)
    times = measure(plan, reps, device)
    profile = device_profile(plan, times, device, ranks_per_node)
    for d, table in profile.matmul.tables.items():
        log(f"matmul {_name(d)} GFLOP/s: {', '.join(f'{s} {r:g}' for s, r in table)}")
    log(f"memory bandwidth (a copy, read + write): {profile.memory_bandwidth / 1e9:.1f} GB/s")
    timings, network = [[*m.key, m.work, t] for m, t in zip(plan, times)], None
    if world > 1:
        collectives = network_plan(device, max_bytes)
        taken = measure(collectives, reps, device)
        network = network_profile(collectives, taken, ranks_per_node, dist.get_backend(), log)
        timings += [[*m.key, t] for m, t in zip(collectives, taken)]
    if rank == 0:
        profiles.save(out, profile, network, {"reps": reps, "timings": TIMINGS, "rows": timings})
        log(f"wrote {out}")
    return profile, network


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m muon_compile.advisor.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the profile file to write")
    cuda = torch.cuda.is_available()
    parser.add_argument("--device", choices=("cpu", "cuda") if cuda else ("cpu",), default="cuda" if cuda else "cpu")
    parser.add_argument("--max-size", type=int, help=f"largest matrix side timed (default {MAX_SIZE})")
    parser.add_argument("--max-bytes", type=int, default=MESSAGE_BYTES[-1], help="largest message per rank (default %(default)s)")
    parser.add_argument("--reps", type=int, default=5, help="timings per measurement, their median kept (default %(default)s)")
    args = parser.parse_args(argv)
    max_size = MAX_SIZE[args.device] if args.max_size is None else args.max_size
    if max_size < SIZES[0]:
        parser.error(f"--max-size must be >= {SIZES[0]}, got {max_size}")
    if args.max_bytes < MESSAGE_BYTES[1]:
        parser.error(f"--max-bytes must be >= {MESSAGE_BYTES[1]} (two message sizes fit a line), got {args.max_bytes}")
    if args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if args.device == "cuda" else torch.device("cpu")
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        calibrate(args.out, device, max_size, args.max_bytes, args.reps)
    finally:
        if distributed:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()

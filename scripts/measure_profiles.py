"""Measure the cost model's profiles of this machine, as seen by the ranks of a run: the
network (collective latency and bandwidth over the process group's backend) and the
device (matmul rates, memory bandwidth, the Newton–Schulz passes' bandwidth, a compiled
step's fixed costs).

    torchrun --nproc-per-node 2 scripts/measure_profiles.py [--reps 9]

Everything is timed on every rank at once, after a barrier, and the slowest rank's time
is kept (median of ``--reps``): a rank of this run shares the cores with the others, so
its rates are the ones that hold while they all run.

* Network: each collective kind of muon_compile.network_profiles on inputs of 4 KiB to
  16 MiB per rank (bf16; fp32 for the reductions), called as the compiled step calls it
  (:func:`collective`: the functional op and its wait), fitted to the profile's own formula,
  ``seconds = steps * latency + factor * bytes / bandwidth``, by least squares on the
  relative error; the fit's worst relative error says how well the alpha-beta model
  describes the backend, and where one line misses a size by more than
  :data:`TOLERANCE`, the small and the large sizes get a line each (:func:`fit_link`:
  gloo's all_gather takes 6-12 times its 4 MiB time at 16 MiB). Each timing repeats the
  collective back to back for :data:`SUSTAINED` seconds, as a step's buckets issue them:
  on gloo at world 2 a small all_gather measured 250-330 us alone after a barrier and
  510-590 us back to back.
* Matmul: bf16 batched ``s x s`` products (scripts/measure_matmul_rates.py, whose
  ``matmul_batch`` sizes the batches per device type: a GPU's must hide the launch), the
  iteration's dtype on this CPU, repeated for :data:`SUSTAINED` seconds per timing; the
  non-square products of :data:`muon_compile.matmul_rates.FAMILIES` at the same short
  sides, spelled as the Newton–Schulz iteration spells them (:func:`family_rates`); and
  single products of :data:`CALL_SIZES`, whose time beyond their arithmetic is the
  latency of a product call (muon_compile.matmul_rates).
  On gloo, the network also measures what the collectives cost the ranks' compute: the
  CPU time of the process group's threads around each timing (:func:`compute_shares`),
  and each kind's cost after 0.3-30 ms of products on every rank, beyond back to back
  (:func:`measure_after_compute`); and the cores the ranks run on, which three one-thread
  ranks share on this VM (``DeviceProfile.shared_cores``).
* Memory: ``y.copy_(x)`` on 64 MiB fp32 tensors, read + write counted, repeated likewise;
  and the Newton–Schulz calls' own passes, muon_compile.ns_kernel's normalisation and
  polynomial step compiled on a stack of bf16 matrices (:func:`_ns_pass_bandwidth`): on
  one CPU thread they convert, divide and compare indices, and ran at 0.67-0.69 of the
  copy's bandwidth at world 2 (docs/benchmarks.md, "Page faults in every step").
* Drift: the VM's matmul rate changes by 10% between minutes (the profile of one run
  measured 513 GFLOP/s at size 512, another 461), so :func:`measure_arms` can time a
  :func:`probe` of the table's :data:`PROBE_SIZE` products in turns with the steps, for
  the validation to scale the table to the rate that held while the steps ran, and
  every collective of the network profile's :func:`sweep` (each kind at each of
  :data:`SIZES`), which the validation records and can fit per workload (a world-3
  profile timed all_to_all's 4-64 KiB at 1.12-1.36 ms in a slow spell, against a median
  of 1.00 ms over seven runs); pricing the steps by it raised two runs' median errors
  and changed no ranking, so it is not the validation's default.

  A timing must be long against the barrier's skew and the scheduler's time slice, or
  ranks that share cores (three on this 2-core VM) take turns instead of running at
  once: a single product of 0.6 ms measured 419 GFLOP/s per rank at world 3, close to
  one rank alone. The Newton–Schulz iteration of a real step runs for tens of ms on
  every rank at once.
* Fixed costs: the compiled ``muon_compile.Muon`` step (scripts/bench_distributed.py's
  arms, each strategy) on FSDP2 matrices of 8 to 31 columns, of one shape or of many, in
  one bucket or in one bucket each, all compiled first and then timed in turns with the
  probes, as the validation times its steps, for :data:`ARM_SECONDS` of the slowest or
  :data:`FIXED_COST_ROUNDS` rounds (:func:`measure_arms`), priced by the cost model with
  ``step + parameters * per_parameter + NS calls * per_call + buckets * per_bucket
  + collectives * per_collective`` seconds more, those fitted for the model to price
  them as measured (:func:`_fixed_costs`): guards, DTensor unwrapping, the runtime
  wrapper, kernel launches, the collectives' dispatch and waits in the compiled graph:
  what the step costs beyond its arithmetic and its collectives' transfer.

:func:`measure_network` and :func:`measure_device` return the raw figures (plain data, JSON
as it is), :func:`network_profile` and :func:`device_profile` the profiles fitted to them as
the cost model takes them, so a saved run can be fitted again when the model changes
(scripts/validate_step_cost.py measures them in the same run as the steps it predicts and
can save and reload them); run as a script, this prints them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import random
import statistics
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch._inductor.utils import fresh_cache
from torch.distributed.device_mesh import init_device_mesh

from bench_distributed import (
    ARMS,
    KELLER,
    NS_STEPS,
    add_backend_argument,
    cpu_seconds,
    failure,
    group_threads,
    machine,
    on_gpu,
    rank_device,
    sharded_params,
    start_backend,
)
from bench_distributed import timed as timed_once
from bench_distributed import timed_host
from measure_matmul_rates import family_call, matmul_batch
from step_split import labelled, profiled_split, splits_by_label

from muon_compile import config
from muon_compile.config import Config, Strategy
from muon_compile.matmul_rates import ASPECT, FAMILIES, MatmulRates, family_table
from muon_compile.ns_args import NSArgs
from muon_compile.ns_cost import TEXTBOOK, pointwise_bytes
from muon_compile.ns_kernel import identity, normalized, polynomial
from muon_compile.network_profiles import COLLECTIVES, Link, NetworkProfile, alpha_beta
from muon_compile.plan import plan_for
from muon_compile.step_cost import FIXED_COSTS, DeviceProfile, overhead_counts, predict

SIZES = [2**k for k in range(12, 26, 2)]  # bytes per rank
# the cost model's tolerance: a prediction within it of the measured step counts as right
# (scripts/validate_step_cost.py), and a fit that misses a measured time by more is split
# in two size ranges (fit_link), each of SEGMENT_POINTS sizes or more
TOLERANCE = 0.2
SEGMENT_POINTS = 3
SUSTAINED = 0.05  # seconds a timed matmul, copy or collective runs on every rank at once
ARM_SECONDS = 2.0  # seconds of timed steps, at least, of the slowest arm that measure_arms times
# rounds, at most, of the fixed-cost steps, timed in turns with the probes (about 1.5 s of
# probes a round at world 2; uncapped, 2 s of these 2-3 ms steps would be 700 rounds)
FIXED_COST_ROUNDS = 40
# compiled instances of each fixed-cost step, before the steps (measure_device) and in
# turns with them (validate_step_cost)
FIXED_COST_INSTANCES = 1
# the fit of the fixed costs (fit_by_rounds): rounds at most, the change in every cost
# (seconds) below which it has settled, and the halvings of a round's change at most
FIT_ROUNDS = 50
FIT_SETTLED = 1e-8
FIT_HALVINGS = 10
# calls of each arm whose host time measure_arms records on a GPU, at most
HOST_ROUNDS = 50
MATMUL_SIZES = (32, 64, 128, 256, 512, 1024)
# the matmul rate that measure_arms can time in turns with the steps, to follow the VM's
# drift between the profile and the steps: batched bf16 products of this size
PROBE_SIZE = 512
# the Newton–Schulz passes' probe (_ns_pass_bandwidth): a stack of gpt-small's widest
# matrices, bf16, about 14 MB on the CPU and 113 MB on a GPU (its memory-bound passes
# reach the bandwidth of HBM there)
NS_PASS_SHAPE = (384, 1536)
NS_PASS_BATCH = {"cpu": 12, "cuda": 96}
# sizes of the single products whose time, less their arithmetic, is a call's latency
CALL_SIZES = (8, 16, 32, 64, 128, 256)
# matrices too small for their arithmetic to count, with a bucket size: the same shape
# (one NS call per rank, however many parameters), distinct shapes (one NS call per
# matrix), and one bucket per matrix
_SHAPES_8 = [(8, 8 + i) for i in range(8)]
FIXED_COST_WORKLOADS = {
    "1 x 8x8": ([(8, 8)], Config.bucket_mb),
    "32 x 8x8": ([(8, 8)] * 32, Config.bucket_mb),
    "8 shapes": (_SHAPES_8, Config.bucket_mb),
    "24 shapes": ([(8 + i // 2, 8 + i) for i in range(24)], Config.bucket_mb),
    "8 shapes, 8 buckets": (_SHAPES_8, 1e-4),
}
# scripts/bench_distributed.py's arm of muon_compile.Muon with each strategy
STRATEGY_ARMS = {Strategy.ALL_TO_ALL: "muon-a2a", Strategy.ALL_GATHER: "muon-gather"}
# the fixed-cost steps as measure_arms takes them, in FIXED_COST_CASES' order
FIXED_COST_CASES = [(name, strategy) for name in FIXED_COST_WORKLOADS for strategy in STRATEGY_ARMS]
FIXED_COST_ARMS = [
    (STRATEGY_ARMS[strategy], FIXED_COST_WORKLOADS[name][0], {"bucket_mb": FIXED_COST_WORKLOADS[name][1]})
    for name, strategy in FIXED_COST_CASES
]


def turns(fns: list, rounds: int, timer: Callable[[Callable], float] | None = None) -> list[list[float]]:
    """Per function, the slowest rank's seconds of each of ``rounds`` calls after a barrier
    (bench_distributed's ``timed``, or ``timer``); the functions take turns, one call each
    per round, so a slow spell of the machine spreads over all of them instead of spoiling one, in an
    order shuffled each round (the same on every rank: the calls' collectives must
    match), so that none always follows the same one. In a fixed order the step timed
    first after the matmul probe measured 2.80 ms, two more instances of it 2.24 and
    2.06 ms; shuffled, 2.29, 2.22 and 2.17 (one-bucket ``small-14``, world 2)."""
    times: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)
        for index in order:
            times[index].append((timer or timed_once)(fns[index]))
    return times


def round_medians(instances: list[list[float]]) -> list[float]:
    """Per round, the median of the instances' times in it (``instances[i][r]``: instance
    ``i`` in round ``r``)."""
    return [statistics.median(times) for times in zip(*instances, strict=True)]


def timed_each(fns: list, reps: int) -> list[float]:
    """Per function, the median of :func:`turns` over ``reps`` rounds, after a warm-up call."""
    for fn in fns:
        fn()  # warm-up
    return [statistics.median(t) for t in turns(fns, reps)]


def probe() -> tuple[Callable[[], None], float]:
    """The matmul probe: :data:`PROBE_SIZE` bf16 products batched as in the profile's
    table, repeated for about :data:`SUSTAINED` seconds (:func:`sustained`), and the
    GFLOP it computes per call."""
    batch = matmul_batch(PROBE_SIZE, rank_device())
    a, b = (torch.randn(batch, PROBE_SIZE, PROBE_SIZE).to(rank_device(), torch.bfloat16) for _ in range(2))
    repeated, count = sustained(lambda: torch.bmm(a, b))
    return repeated, count * 2 * batch * PROBE_SIZE**3 / 1e9


def timed_rounds(longest: float, reps: int, arm_seconds: float, max_rounds: int = 0) -> int:
    """Rounds of :func:`measure_arms`' turns: ``reps``, or more, up to ``arm_seconds`` of the
    ``longest`` step, capped at ``max_rounds`` where that is not 0 (never below ``reps``);
    none when there is no step (``longest`` 0)."""
    if not longest:
        return 0
    rounds = max(reps, math.ceil(arm_seconds / longest))
    return min(rounds, max(reps, max_rounds)) if max_rounds else rounds


def compiled_arm(key: str, shapes: list, mesh, overrides: dict, warmup: int):
    """bench_distributed's arm ``key`` on fresh FSDP2 matrices of ``shapes``, compiled with
    the config ``overrides`` and called ``warmup`` times after the call that compiles it."""
    _, build, backend, strategy = ARMS[key]
    with config.override(**({"strategy": strategy} if strategy else {}), **overrides):
        # static shapes: the arms share the step's code, and a recompile for other shapes
        # would otherwise trace it with dynamic shapes, which the passes leave alone
        step = torch.compile(build(sharded_params(shapes, mesh)), backend=backend, dynamic=False)
        for _ in range(warmup + 1):  # the first call compiles
            step()
    return step


def measure_arms(
    arms: list[tuple[str, list, dict]],
    mesh,
    warmup: int,
    reps: int,
    with_probe: bool = False,
    instances: int | list[int] = 1,
    arm_seconds: float = ARM_SECONDS,
    split_steps: int = 0,
    max_rounds: int = 0,
    own_cache: bool = True,
) -> tuple[list[dict], list[float]]:
    """Per arm ``(bench_distributed arm, shapes, config overrides)``, its step times
    (``{"times": [...]}``, seconds) or the error it failed with (``{"error": ...}``).
    Every arm is compiled (in a fresh Inductor cache of its own, or with ``own_cache``
    False in the caller's, so that a step the caller compiled before is read from it:
    validate_step_cost's fixed-cost steps, compiled again for each workload) and warmed
    up first, then the arms are
    timed in :func:`turns`: ``reps`` rounds, or more, up to ``arm_seconds`` of the
    slowest arm's steps, so that short steps, whose single timings spread most, get more
    of them (``arm_seconds`` 0: ``reps`` rounds, enough to check the script runs), and at
    most ``max_rounds`` where that is not 0 and not below ``reps``. No arm may recompile
    while timed. ``with_probe``: each round also times
    :func:`probe_calls`, which come second: ``{"matmul": GFLOP/s per round, (kind,
    bytes per rank): seconds per call per round}`` (else an empty dict).

    ``instances``: each arm is built and compiled that many times (or, given a list, as
    many as the list says for that arm), each instance on parameters of its own, and a
    round times every instance once; the arm's time in a round is the median of its
    instances' (their raw times under ``"instance_times"``, where it has more than one).
    Instances of one step, timed in shuffled turns, still measure medians up to 13% apart
    (three of the one-bucket ``small-14`` step at world 2: 2.59, 2.37 and 2.29 ms), so
    one instance measures its own speed as much as the step's.

    On a GPU, each arm's first instance is then called :data:`HOST_ROUNDS` times more (or
    as many as the rounds, if fewer), in turns, and the time its host took to issue each
    call is kept under ``"host_times"`` (bench_distributed's ``timed_host``): what the
    cost model's host clock prices where the host queues kernels.

    ``split_steps``: after the timing, that many more rounds are profiled, each arm's
    calls under a label of its own, and every rank's split of its steps there
    (scripts/step_split.py's ``splits_by_label``) is kept under ``"split"``, a list by
    rank; then its first instance is profiled for that many steps alone, one after the
    other, under ``"split_alone"`` (``profiled_split``). Not under NCCL."""
    results: list[dict] = [{} for _ in arms]
    counts = instances if isinstance(instances, list) else [instances] * len(arms)
    if len(counts) != len(arms):
        raise ValueError(f"measure_arms: {len(counts)} instance counts for {len(arms)} arms")
    steps: list[tuple[list, dict]] = []
    cache = fresh_cache() if own_cache else contextlib.nullcontext()
    with cache, torch._dynamo.config.patch(recompile_limit=64 * max(counts, default=1)):
        for (key, shapes, overrides), count, result in zip(arms, counts, results):
            try:
                steps.append(([compiled_arm(key, shapes, mesh, overrides, warmup) for _ in range(count)], result))
            except Exception as exc:  # report and go on: the caller shows the failure
                result["error"] = failure(exc)
        with torch._dynamo.config.patch(error_on_recompile=True):
            fns = [step for copies, _ in steps for step in copies]
            longest = max((timed_once(fn) for fn in fns), default=0.0)  # the same on every rank
            rounds = timed_rounds(longest, reps, arm_seconds, max_rounds)
            probes = probe_calls() if with_probe else {}
            times = turns(fns + [repeated for repeated, _ in probes.values()], rounds)
            start = 0
            for copies, result in steps:
                own, start = times[start : start + len(copies)], start + len(copies)
                result["times"] = round_medians(own)
                if len(copies) > 1:
                    result["instance_times"] = own
            if on_gpu():
                issued = turns([copies[0] for copies, _ in steps], min(rounds, HOST_ROUNDS), timed_host)
                for (_, result), series in zip(steps, issued):
                    result["host_times"] = series
            if split_steps and not on_gpu():
                _profile_splits(steps, [repeated for repeated, _ in probes.values()], split_steps)
    torch._dynamo.reset()
    probed = times[len(fns):]
    return results, {key: [per / t if key == "matmul" else t / per for t in series]
                      for (key, (_, per)), series in zip(probes.items(), probed)}


def _profile_splits(steps: list[tuple[list, dict]], probes: list, rounds: int) -> None:
    """Each arm's measured split (:func:`measure_arms`' ``split_steps``) into its result:
    in ``rounds`` more profiled :func:`turns` with the ``probes``, and alone."""
    labels = [f"measure_arms: arm {index}" for index in range(len(steps))]
    fns = [labelled(step, label) for label, (copies, _) in zip(labels, steps) for step in copies]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        turns(fns + probes, rounds)
    in_turns = splits_by_label(prof.events(), labels)
    world = dist.get_world_size()
    for label, (copies, result) in zip(labels, steps):
        result["split"], result["split_alone"] = [None] * world, [None] * world
        dist.all_gather_object(result["split"], in_turns[label])
        dist.all_gather_object(result["split_alone"], profiled_split(copies[0], rounds))


def probe_calls() -> dict:
    """The probes :func:`measure_arms` times in turns with the steps, each with what one
    call of it does: ``"matmul"``, the :func:`probe` and its GFLOP per call, and with more
    than one rank, under ``(kind, bytes per rank)``, each collective of
    the network profile's :func:`sweep`, repeated (:func:`sustained`), and its count of calls."""
    world = dist.get_world_size()
    calls = {"matmul": probe()}
    if world > 1:
        calls.update({key: sustained(fn) for key, fn in sweep(world).items()})
    return calls


def collective(kind: str, nbytes: int, world: int, value: float = 0.0) -> Callable[[], torch.Tensor]:
    """One call of the collective ``kind`` on ``nbytes`` per rank, as the compiled step
    makes it: the functional op the graph holds (``torch.ops._c10d_functional``, whose
    names are :data:`~muon_compile.network_profiles.COLLECTIVES`; the gloo process group
    runs its coalesced all_gather for it, not ``dist.all_gather_into_tensor``'s) and its
    ``wait_tensor``. It sends ``value`` in bf16, as the step sends; in fp32 for the
    reductions."""
    ops, group = torch.ops._c10d_functional, dist.group.WORLD.group_name
    on = {"fill_value": value, "device": rank_device()}
    if kind == "all_gather_into_tensor":
        x = torch.full((nbytes // 2,), dtype=torch.bfloat16, **on)
        return lambda: ops.wait_tensor(ops.all_gather_into_tensor(x, world, group))
    if kind == "all_to_all_single":
        x = torch.full((world * (nbytes // 2 // world),), dtype=torch.bfloat16, **on)
        splits = [x.numel() // world] * world
        return lambda: ops.wait_tensor(ops.all_to_all_single(x, splits, splits, group))
    if kind == "reduce_scatter_tensor":
        x = torch.full((world * (nbytes // 4 // world),), dtype=torch.float32, **on)
        return lambda: ops.wait_tensor(ops.reduce_scatter_tensor(x, "sum", world, group))
    x = torch.full((nbytes // 4,), dtype=torch.float32, **on)
    return lambda: ops.wait_tensor(ops.all_reduce(x, "sum", group))


def repeat(fn: Callable[[], object], count: int) -> Callable[[], None]:
    """A call of ``fn`` ``count`` times in a row."""

    def repeated() -> None:
        for _ in range(count):
            fn()

    return repeated


def sustained(fn):
    """``fn`` repeated to last about :data:`SUSTAINED` seconds on the slowest rank (the
    same count on every rank), and the count."""
    count = max(1, round(SUSTAINED / timed_each([fn], 1)[0]))
    return repeat(fn, count), count


def least_squares(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """The ``x`` minimising ``|a x - b|`` (``b`` a column)."""
    return torch.linalg.lstsq(a, b).solution.flatten().tolist()


def fit(points: list[tuple[float, float]], steps: float, factor: float) -> tuple[float, float, float]:
    """Fit ``t = steps * latency + factor * b / bandwidth`` minimising the squared *relative*
    error (small messages count as much as large ones): latency, bandwidth, worst error.
    Neither term may be negative: where the best line has one, the other alone is fitted
    (small messages whose times do not grow with their size: latency alone). With
    ``steps`` and ``factor`` 0 (one rank: the model prices the collective at nothing)
    there is nothing to fit: no latency, unbounded bandwidth."""
    if steps == factor == 0:
        return 0.0, math.inf, 0.0
    # each row times (latency, 1/bandwidth) ~ 1
    rows = torch.tensor([(steps / t, factor * b / t) for b, t in points], dtype=torch.float64)
    ones = torch.ones(len(points), 1, dtype=torch.float64)
    latency, inverse = least_squares(rows, ones)
    if latency < 0:  # no latency term fits: bandwidth alone
        latency, (inverse,) = 0.0, least_squares(rows[:, 1:], ones)
    elif inverse < 0:  # no bandwidth term fits: latency alone
        (latency,), inverse = least_squares(rows[:, :1], ones), 0.0
    worst = max(abs(steps * latency + factor * b * inverse - t) / t for b, t in points)
    return latency, (1 / inverse if inverse else math.inf), worst


def fit_link(points: list[tuple[float, float]], steps: float, factor: float) -> tuple[Link, float]:
    """The link of one :func:`fit` to all ``points`` (``(bytes, seconds)``), or, where that
    line misses a point by more than :data:`TOLERANCE`, of one fit to the small messages
    and one to the large (:attr:`Link.large`), split where the worse of the two misses
    least, each fitted to :data:`SEGMENT_POINTS` points or more and the boundary halfway
    between their sizes (geometric mean); with the link, its worst relative error."""
    points = sorted(points)
    latency, bandwidth, worst = fit(points, steps, factor)
    best = Link(latency, bandwidth), worst
    if worst <= TOLERANCE:
        return best
    for split in range(SEGMENT_POINTS, len(points) - SEGMENT_POINTS + 1):
        (small_latency, small_bandwidth, small_worst), (large_latency, large_bandwidth, large_worst) = (
            fit(points[:split], steps, factor), fit(points[split:], steps, factor))
        if max(small_worst, large_worst) < best[1]:
            boundary = math.sqrt(points[split - 1][0] * points[split][0])
            large = Link(large_latency, large_bandwidth)
            best = Link(small_latency, small_bandwidth, large_from=boundary, large=large), max(small_worst, large_worst)
    return best


def per_call(fns: list, reps: int) -> list[float]:
    """Seconds per call of each of ``fns``, each repeated for about :data:`SUSTAINED`
    seconds per timing (:func:`sustained`), the timings taking turns (:func:`timed_each`)."""
    return per_call_and_cpu(fns, reps, ())[0]


def per_call_and_cpu(fns: list, reps: int, threads) -> tuple[list[float], list[float]]:
    """:func:`per_call`'s seconds per call of each of ``fns``, and the seconds this
    process's ``threads`` (ids) ran on a core per call of each (bench_distributed's
    ``cpu_seconds``, read around each timing's repeated calls, the warm-up's included)."""
    repeated = [sustained(fn) for fn in fns]
    ran = [[0.0, 0] for _ in fns]  # per function: the threads' seconds on a core, calls

    def counted(index: int, fn: Callable[[], None], count: int) -> Callable[[], None]:
        def call() -> None:
            before = cpu_seconds(threads)
            fn()
            ran[index][0] += cpu_seconds(threads) - before
            ran[index][1] += count

        return call

    timings = timed_each([counted(i, r, c) for i, (r, c) in enumerate(repeated)], reps)
    return [t / count for t, (_, count) in zip(timings, repeated)], [used / calls for used, calls in ran]


def sweep(world: int) -> dict[tuple[str, int], Callable[[], torch.Tensor]]:
    """The network profile's calls: each collective kind at each of :data:`SIZES` per
    rank (:func:`collective`), under ``(kind, bytes per rank)``."""
    return {(kind, nbytes): collective(kind, nbytes, world) for kind in COLLECTIVES for nbytes in SIZES}


def by_kind(values: dict[tuple[str, int], object]) -> dict[str, list[tuple[int, object]]]:
    """``values`` keyed as :func:`sweep`'s calls, ``(kind, bytes per rank)``, as
    ``{kind: [(bytes per rank, value), ...]}`` in the sweep's order."""
    grouped: dict[str, list[tuple[int, object]]] = {}
    for (kind, nbytes), value in values.items():
        grouped.setdefault(kind, []).append((nbytes, value))
    return grouped


def measure_network(reps: int) -> tuple[dict[str, list[tuple[int, float]]], dict]:
    """Per collective kind, ``(bytes per rank, seconds per call)`` at each of :data:`SIZES`,
    the calls of :func:`sweep` back to back as a step's buckets issue them (:func:`per_call`);
    and on gloo, whose threads run on the cores the step computes on, what the calls cost
    those cores (empty on another backend): ``cores`` this process may run on, torch's
    ``threads`` per rank, and per kind ``(bytes per rank, seconds per call, seconds the
    process group's threads ran on a core per call)``, the last the ranks' mean.
    :func:`compute_shares` turns them into the network profile's shares of the compute."""
    calls = sweep(dist.get_world_size())
    threads = list(group_threads()) if dist.get_backend() == "gloo" else []
    seconds, cpu = per_call_and_cpu(list(calls.values()), reps, threads)
    points = by_kind(dict(zip(calls, seconds)))
    if not threads:
        return points, {}
    mean = torch.tensor(cpu, dtype=torch.float64)
    dist.all_reduce(mean)
    mean /= dist.get_world_size()
    used = by_kind({key: (t, c) for key, t, c in zip(calls, seconds, mean.tolist())})
    figures = {kind: [(nbytes, t, c) for nbytes, (t, c) in kind_points] for kind, kind_points in used.items()}
    return points, {"cores": len(os.sched_getaffinity(0)), "threads": torch.get_num_threads(), "points": figures}


def compute_shares(cpu: dict, world: int) -> dict[str, tuple[tuple[float, float], ...]]:
    """The network profile's ``compute_share`` of :func:`measure_network`'s ``cpu``
    figures: per kind and size, the share of each rank's compute that the collective
    takes while in flight. Its threads run ``c`` seconds on a core per call of ``t``
    seconds on each of ``world`` ranks: ``world * c / t`` cores. The ranks' compute runs
    on ``min(cores, world * threads)`` of them; a core it leaves idle takes that work
    first, and the rest is the share of the compute's cores, at most 1."""
    busy = min(cpu["cores"], world * cpu["threads"])
    spare = cpu["cores"] - busy
    return {
        kind: tuple((float(nbytes), min(1.0, max(0.0, world * c / t - spare) / busy)) for nbytes, t, c in points)
        for kind, points in cpu["points"].items()
    }


# what a collective costs after a stretch of compute on every rank, beyond its time back
# to back (measure_after_compute): the step's two kinds, at a small bucket's size per
# rank, after about each of these seconds of products (docs/benchmarks.md, "A collective
# after a stretch"); each timing lasts about AFTER_TIMING seconds
AFTER_KINDS = ("all_to_all_single", "all_gather_into_tensor")
AFTER_BYTES = 16 * 1024
AFTER_GAPS = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
AFTER_TIMING = 0.2


def seconds_per_call(fn: Callable[[], object], calls: int) -> float:
    """Seconds per call of ``fn`` over ``calls`` calls in a row, the slowest rank's
    (bench_distributed's ``timed``: after a barrier)."""
    return timed_once(repeat(fn, calls)) / calls


def products(seconds: float) -> Callable[[], None]:
    """bf16 products of a batch of eight 96 x 96 matrices (a small bucket's Newton–Schulz
    size), as many as take about ``seconds`` on this rank, one at least (the same count on
    every rank: the slowest rank's time per product decides)."""
    a, b = torch.randn(8, 96, 96).bfloat16(), torch.randn(8, 96, 96).bfloat16()

    def product() -> torch.Tensor:
        return torch.bmm(a, b)

    return repeat(product, max(1, round(seconds / seconds_per_call(product, 200))))


def after_compute(call: Callable[[], object], work: Callable[[], None] | None, reps: int) -> tuple[float, float, float]:
    """Seconds per call, each the median of ``reps`` timings of the slowest rank: of
    ``call`` alone, back to back; of ``work`` alone (0 without it); and of ``call`` after
    ``work``, less the work. The calls of a timing last about :data:`AFTER_TIMING` seconds."""
    once = seconds_per_call(call, 10)
    compute = seconds_per_call(work, 10) if work else 0.0
    then_call = (lambda: (work(), call())) if work else call
    n = max(10, round(AFTER_TIMING / (compute + once)))
    rows = []
    for _ in range(reps):
        alone = seconds_per_call(call, n)
        took = seconds_per_call(work, n) if work else 0.0
        rows.append((alone, took, seconds_per_call(then_call, n) - took))
    alone, took, after = (statistics.median(column) for column in zip(*rows))
    return alone, took, after


def _nothing() -> None:
    """No compute: a rank that waits at the collective (:func:`measure_after_compute`)."""


def measure_after_compute(reps: int, alone: bool = False) -> dict[str, list[tuple[float, float]]]:
    """Per kind of :data:`AFTER_KINDS`, ``(seconds of compute, seconds)`` after each of
    :data:`AFTER_GAPS`: the products' measured time per call (:func:`products`), and what
    the collective of :data:`AFTER_BYTES` per rank costs after them beyond its time back
    to back (:func:`after_compute`). Where ranks share cores, they end the same stretch
    at different times, and the first waits for the last at the collective; the network
    profile's ``after_compute`` (:func:`network_profile`). With ``alone``, rank 0 alone
    computes and the others wait at the collective: its ``after_compute_alone``."""
    world, rank = dist.get_world_size(), dist.get_rank()
    measured = {}
    for kind in AFTER_KINDS:
        call = collective(kind, AFTER_BYTES, world)
        # every rank calibrates the products (a collective); the waiting ones run none
        works = [products(gap) for gap in AFTER_GAPS]
        rows = [after_compute(call, work if rank == 0 or not alone else _nothing, reps) for work in works]
        measured[kind] = [(took, after - back_to_back) for back_to_back, took, after in rows]
    return measured


def network_profile(
    points: dict[str, list[tuple[int, float]]],
    world: int,
    backend: str,
    log=print,
    cpu: dict | None = None,
    after: dict[str, list[tuple[float, float]]] | None = None,
    after_alone: dict[str, list[tuple[float, float]]] | None = None,
) -> NetworkProfile:
    """The links fitted to :func:`measure_network`'s ``points`` (all ranks on one node),
    with its ``cpu`` figures the share of the compute each kind takes
    (:func:`compute_shares`), and with :func:`measure_after_compute`'s ``after`` what a
    collective costs after a stretch of compute (in increasing stretch; a negative figure,
    the timings' noise, taken as 0), and ``after_alone`` the same with one rank computing;
    ``log`` gets a line per kind with its fit and its points, its shares and its costs
    after compute."""
    links = {}
    shares = compute_shares(cpu, world) if cpu else {}

    def costs(after):
        return {kind: tuple(sorted({float(s): max(0.0, float(e)) for s, e in rows}.items())) for kind, rows in (after or {}).items()}

    late, late_alone = costs(after), costs(after_alone)
    for kind, kind_points in points.items():
        links[kind], worst = fit_link(kind_points, *alpha_beta(kind, world))
        shown = ", ".join(f"{b // 1024} KiB {t * 1e3:.3f} ms" for b, t in kind_points)
        log(f"{kind}: {links[kind].describe()}, worst fit error {worst:.0%}")
        log(f"    {shown}")
        if kind in shares:
            log(f"    share of the compute in flight: {', '.join(f'{b // 1024:.0f} KiB {s:.2f}' for b, s in shares[kind])}")
        for label, kind_costs in (("after compute", late), ("after compute, one rank computing", late_alone)):
            if kind in kind_costs:
                log(f"    {label}: {', '.join(f'{s * 1e3:.2f} ms +{e * 1e3:.3f} ms' for s, e in kind_costs[kind])}")
    a2a = links["all_to_all_single"]
    return NetworkProfile(
        f"{backend}-w{world}",
        f"measured by scripts/measure_profiles.py, {backend}, world {world}",
        intra=a2a,
        inter=a2a,
        ranks_per_node=world,
        kinds=links,
        compute_share=shares,
        after_compute=late,
        after_compute_alone=late_alone,
    )


def _memory_bandwidth(reps: int) -> float:
    x = torch.ones(16 * 2**20, device=rank_device())
    y = torch.empty_like(x)
    return 2 * x.numel() * x.element_size() / per_call([lambda: y.copy_(x)], reps)[0]


def _ns_pass_bandwidth(reps: int) -> float:
    """Bytes/s of the Newton–Schulz calls' memory-bound passes, as the cost model counts
    them (:func:`muon_compile.ns_cost.pointwise_bytes`, textbook, the benchmarks' steps): a stack of
    :data:`NS_PASS_SHAPE` matrices in bf16, :data:`NS_PASS_BATCH` of them on the device,
    through the normalisation and the iteration's polynomial step of
    :mod:`muon_compile.ns_kernel`, each compiled by Inductor, timed as the copy is."""
    rows, cols = NS_PASS_SHAPE
    device, steps = rank_device(), NS_STEPS
    args = NSArgs((KELLER,) * steps, compute_dtype=torch.bfloat16, algorithm=TEXTBOOK)
    batch = NS_PASS_BATCH[device.type]
    x = torch.randn(batch, rows, cols, device=device).to(torch.bfloat16)
    a, aa = (torch.randn(batch, rows, rows, device=device).to(torch.bfloat16) for _ in range(2))
    norm = torch.compile(lambda x: normalized(x, args)[0].to(torch.bfloat16))
    step = torch.compile(
        lambda a, aa: polynomial(a, aa, KELLER, identity(rows, a.device, torch.float32), torch.bfloat16)
    )
    passes = [lambda: norm(x), lambda: step(a, aa)]
    for call in passes:  # compile before timing
        call()
    normalise, iterate = per_call(passes, reps)
    return batch * pointwise_bytes(TEXTBOOK, rows, cols, steps, torch.bfloat16) / (normalise + steps * iterate)


def _products(shapes: list[tuple[int, int]], reps: int) -> list[float]:
    """Seconds per bf16 ``bmm`` call on a batch of ``(batch, size)`` square matrices, each."""
    operands = [tuple(torch.randn(n, s, s).to(rank_device(), torch.bfloat16) for _ in range(2)) for n, s in shapes]
    return per_call([lambda a=a, b=b: torch.bmm(a, b) for a, b in operands], reps)


def square_rates(reps: int) -> list[tuple[int, float]]:
    """``(size, GFLOP/s)`` of bf16 batched square products at each of :data:`MATMUL_SIZES`."""
    batches = [matmul_batch(s, rank_device()) for s in MATMUL_SIZES]
    batched = _products(list(zip(batches, MATMUL_SIZES)), reps)
    return [(s, round(2 * n * s**3 / t / 1e9, 1)) for s, n, t in zip(MATMUL_SIZES, batches, batched)]


def family_rates(family: str, reps: int) -> list[tuple[int, float]]:
    """``(short side, GFLOP/s)`` of bf16 batched products of ``family`` at each of
    :data:`MATMUL_SIZES`, as measure_matmul_rates' :func:`family_call` batches and writes them."""
    calls, flops = zip(*(family_call(family, s, rank_device()) for s in MATMUL_SIZES))
    return [(s, round(f / t / 1e9, 1)) for s, f, t in zip(MATMUL_SIZES, flops, per_call(list(calls), reps))]


def measure_device(reps: int, arm_seconds: float = ARM_SECONDS, own_cache: bool = True) -> dict:
    """The device's raw figures, as :func:`device_profile` takes them, every rank
    computing at once for :data:`SUSTAINED` seconds per timing, after a barrier (the
    slowest rank's time; ``sustained_s`` records the duration): ``matmul``, the bf16
    ``(size, GFLOP/s)`` of large batches; ``matmul_families``, per family of
    non-square products, ``(short side, GFLOP/s)`` (:func:`family_rates`);
    ``matmul_call``, the ``(size, seconds)`` of one
    product call on a single matrix; ``memory_bandwidth`` in bytes/s (a copy);
    ``ns_pass_bandwidth``, the Newton–Schulz passes' bytes/s (:func:`_ns_pass_bandwidth`);
    ``fixed``, the compiled step's median seconds on each of
    :data:`FIXED_COST_WORKLOADS` with each strategy (``{workload: {strategy: seconds}}``),
    timed in turns with the probes (``fixed_timing`` says how), and on a GPU
    ``fixed_host``, the median seconds its host took to issue each (:func:`measure_arms`'
    ``host_times``);
    ``kind``, the device type the ranks computed on (``cuda`` under NCCL, one GPU per
    rank, else ``cpu``). ``arm_seconds`` and ``own_cache``: the fixed-cost steps' timing
    and cache, as :func:`measure_arms` takes them."""
    table = square_rates(reps)
    calls = _products([(1, s) for s in CALL_SIZES], reps)
    world = dist.get_world_size()
    mesh = init_device_mesh(rank_device().type, (world,))
    timed = measure_arms(
        FIXED_COST_ARMS, mesh, 2, reps, with_probe=True, instances=FIXED_COST_INSTANCES, arm_seconds=arm_seconds,
        max_rounds=FIXED_COST_ROUNDS, own_cache=own_cache,
    )[0]
    fixed = fixed_step_medians(timed)
    fixed_host = fixed_step_medians(timed, "host_times")
    return {
        "matmul": table,
        "matmul_families": {family: family_rates(family, reps) for family in FAMILIES},
        "matmul_call": list(zip(CALL_SIZES, calls)),
        "memory_bandwidth": _memory_bandwidth(reps),
        "ns_pass_bandwidth": _ns_pass_bandwidth(reps),
        "sustained_s": SUSTAINED,
        "fixed": fixed,
        "fixed_timing": f"in turns with the probes, {FIXED_COST_ROUNDS} rounds at most",
        **({"fixed_host": fixed_host} if fixed_host else {}),
        "threads": torch.get_num_threads(),
        "kind": rank_device().type,
    }


def fixed_step_medians(results: list[dict], key: str = "times") -> dict[str, dict[str, float]]:
    """``{workload: {strategy: seconds}}``, the median of each fixed-cost step's ``key``
    (``times``, or on a GPU ``host_times``) in :func:`measure_arms`' ``results`` for
    :data:`FIXED_COST_ARMS`, as :func:`device_profile` takes them under ``fixed`` (and
    ``fixed_host``); empty where no result has ``key``. A step that failed raises: the
    fixed costs cannot be fitted without it."""
    medians: dict[str, dict[str, float]] = {}
    for (name, strategy), result in zip(FIXED_COST_CASES, results):
        if "error" in result:
            raise RuntimeError(f"measuring the fixed costs: {STRATEGY_ARMS[strategy]} on {name} failed: {result['error']}")
        if key in result:
            medians.setdefault(name, {})[strategy.value] = statistics.median(result[key])
    return medians


def collectives_wait_behind_compute(backend: str, realtime_gloo: bool) -> bool:
    """Whether a collective's cost in the step grows with the compute before it: gloo's
    threads at ordinary priority wait for a core behind the step's compute, a collective
    then costing 0.03 ms more than back to back after no compute and 0.3-0.8 ms more after
    0.2-3 ms (docs/benchmarks.md, "A collective after compute"). No constant per collective
    describes that; with gloo's threads real-time (``--realtime-gloo``) or under NCCL, one
    does."""
    return backend == "gloo" and not realtime_gloo


def summary(errors: list[float]) -> str:
    """The median, worst and count within :data:`TOLERANCE` of absolute relative errors."""
    return (f"median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%}, "
            f"within {TOLERANCE:.0%}: {sum(e <= TOLERANCE for e in errors)}/{len(errors)}")


def fit_by_rounds(
    price: Callable[[dict[str, float]], list[float]], counts: torch.Tensor, measured: list[float], terms: list[str], log
) -> tuple[dict[str, float], list[float]]:
    """The non-negative seconds of each of ``terms``, from none, for which ``price`` (of
    ``{term: seconds}``, each step's seconds) comes close to ``measured``, and its prices.
    Each round solves, by least squares on ``counts`` (a row per step, a column per term),
    for what ``price`` at the terms so far still misses, sets a term that goes negative to
    0 and keeps the others, and halves that change until the steps are priced closer in
    squares (:data:`FIT_HALVINGS` times at most; never closer: the fit has settled); the
    fit stops when no term moves by :data:`FIT_SETTLED`, after :data:`FIT_ROUNDS` rounds
    at most (logged). Without the halving, a price that rises faster than the counts say
    (a collective starting later after the longer stretch) overshoots: four saved runs
    swung between two fits until the last round."""

    def missed(values: list[float]) -> float:
        return sum((m - v) ** 2 for m, v in zip(measured, values))

    costs = dict.fromkeys(terms, 0.0)
    prices = price(costs)
    for _ in range(FIT_ROUNDS):
        gap = torch.tensor([m - p for m, p in zip(measured, prices)], dtype=torch.float64)[:, None]
        change = dict(zip(terms, least_squares(counts, gap)))
        before = missed(prices)
        for _ in range(FIT_HALVINGS + 1):
            trial = {t: max(c + change[t], 0.0) for t, c in costs.items()}
            values = price(trial)
            if missed(values) < before:
                break
            change = {t: c / 2 for t, c in change.items()}
        else:
            return costs, prices
        moved = max(abs(trial[t] - costs[t]) for t in terms)
        costs, prices = trial, values
        if moved < FIT_SETTLED:
            return costs, prices
    log(f"fixed costs: still moving after {FIT_ROUNDS} rounds of the fit")
    return costs, prices


def _fixed_costs(
    fixed: dict[str, dict[str, float]],
    arithmetic: DeviceProfile,
    network: NetworkProfile,
    world: int,
    per_collective: bool,
    log,
    host: bool = False,
) -> dict[str, float]:
    """The seconds of each of the cost model's
    :data:`~muon_compile.step_cost.FIXED_COSTS` (per step, parameter, NS call, bucket and
    collective) of the compiled Muon step beyond its arithmetic and its collectives' transfer,
    fitted so that the cost model with them prices the measured ``fixed`` steps (see
    :data:`FIXED_COST_WORKLOADS`) as measured, in least squares. The model's price of a step
    is not its price without fixed costs plus the costs: they lengthen the stretches of
    compute after which a collective starts late
    (:meth:`~muon_compile.network_profiles.NetworkProfile.after`), and ranks that share
    cores end them at other times. So the fit starts from none and refits, by least
    squares on the plans' :func:`~muon_compile.step_cost.overhead_counts`, what the model
    with the costs so far still misses, round after round (:func:`fit_by_rounds`); a term
    that goes negative is set to 0 and the others kept.
    Fitted once to the steps less their price without fixed costs (before 2026-11-28), the
    costs held the delay after their own stretches, which the model then charged again: it
    priced the very steps they were fitted to 6-49% high at world 3 (docs/benchmarks.md,
    "Fixed costs fitted to the model's own price"). Setting a negative term to 0 is not the
    best non-negative fit: refitting the others without it prices less per NS call and
    predicts the validation's steps worse (docs/benchmarks.md, "A collective after
    compute"). The cost per collective is told
    apart from the cost per bucket by the steps of both strategies (an ``all_to_all``
    bucket issues two collectives, an ``all_gather`` one); without ``per_collective``
    (:func:`collectives_wait_behind_compute`), or with one rank (no collective), it is not
    fitted and is 0; nor, with one rank, is the cost per bucket, whose every bucket is one
    NS call (:func:`muon_compile.plan.local_plan`): the cost per NS call holds both. On a
    device that queues its kernels the fixed costs are host time, which the model adds to
    a step only where the device waits for it; fitted to the
    steps' times, the fit is exact for steps whose host time exceeds their device time,
    as the fixed-cost workloads' matrices of 8 to 31 rows have on a GPU
    (docs/benchmarks.md, "GPU"). With ``host``, ``fixed`` holds the steps' host times
    (``fixed_host``) and the fit is to the model's host seconds, whatever the device's share."""
    plans, measured, shown = [], [], []
    for name, (shapes, mb) in FIXED_COST_WORKLOADS.items():
        for strategy in STRATEGY_ARMS:
            plans.append(plan_for(shapes, world, strategy, mb))
            measured.append(fixed[name][strategy.value])
            shown.append(f"{name} {strategy.value}")

    none = arithmetic.without_fixed_costs()  # the terms left out of the fit stay 0, as returned

    def priced(costs: dict[str, float]) -> list[float]:  # the model's seconds of each step with ``costs``
        device = dataclasses.replace(none, **costs)
        return [max(c.host) if host else c.step for c in (predict(p, Config.prefetch, device, network) for p in plans)]

    bare = priced({})
    what = "compiled Muon step's host time" if host else "compiled Muon step"
    log(f"{what} beyond its arithmetic: {', '.join(f'{s} {(m - b) * 1e3:.3f} ms' for s, m, b in zip(shown, measured, bare))}")
    counts = [dict(zip(FIXED_COSTS, overhead_counts(plan))) for plan in plans]
    fit_collectives = per_collective and any(c["collective_overhead"] for c in counts)
    # one rank's steps make one NS call per bucket (plan_for's local_plan): priced per call
    fit_buckets = any(c["bucket_overhead"] != c["call_overhead"] for c in counts)
    terms = [
        name for name in FIXED_COSTS
        if (fit_collectives or name != "collective_overhead") and (fit_buckets or name != "bucket_overhead")
    ]
    counted = torch.tensor([[float(c[term]) for term in terms] for c in counts], dtype=torch.float64)
    fitted, prices = fit_by_rounds(priced, counted, measured, terms, log)
    costs = {name: fitted.get(name, 0.0) for name in FIXED_COSTS}
    log(f"{what} as priced with its fixed costs: {summary([abs(p / m - 1) for p, m in zip(prices, measured)])}")
    return costs


def rates_of(figures: dict, kind: str, dtypes: tuple[torch.dtype, ...], source: str, log=print) -> MatmulRates:
    """The :class:`MatmulRates` of :func:`measure_device`'s ``figures`` (its ``matmul``
    table, and its ``matmul_families`` and ``matmul_call`` where measured), for each of
    ``dtypes``; ``log`` gets a line per table."""
    table = tuple((int(s), float(r)) for s, r in figures["matmul"])
    log(f"matmul bf16 GFLOP/s: {table}")
    rates = MatmulRates(kind, source, dict.fromkeys(dtypes, table))
    if "matmul_families" in figures:  # runs saved before 2026-11-25 priced every product by its volume
        families = {}
        for family, points in figures["matmul_families"].items():
            families[family] = dict.fromkeys(dtypes, family_table(family, points))
            log(f"matmul bf16 GFLOP/s, {family} (x{ASPECT}), by short side: {tuple((int(s), float(r)) for s, r in points)}")
        rates = dataclasses.replace(rates, families=families)
    if "matmul_call" in figures:  # runs saved before 2026-11-24 did not measure it
        latency = tuple((int(s), max(0.0, t - rates.seconds(torch.bfloat16, s, s, s))) for s, t in figures["matmul_call"])
        rates = dataclasses.replace(rates, latency=dict.fromkeys(dtypes, latency))
        log(f"matmul bf16 call latency us: {tuple((s, round(t * 1e6, 1)) for s, t in latency)}")
    return rates


def device_profile(
    figures: dict, network: NetworkProfile, world: int, log=print, per_collective: bool = True, cores: int = 0
) -> DeviceProfile:
    """The device profile of :func:`measure_device`'s ``figures``, its fixed costs fitted
    with ``network`` pricing the collectives of the fixed-cost steps, a cost per collective
    among them where ``per_collective`` (see :func:`_fixed_costs`). On the CPU, where the
    ``world`` ranks' threads outnumber the ``cores`` they run on (0: not known; runs saved
    before 2026-11-27's evening did not record them), the ranks share those cores
    (``DeviceProfile.shared_cores``: a rank computing alone runs faster). On the CPU the host
    computes, and collectives overlap its compute where ``network`` gives their share of
    it (runs saved before 2026-11-27's evening did not measure it: they hold its cores
    instead); on a GPU, NCCL runs on a
    stream of its own, the host queues the kernels ahead of the device (its fixed costs
    and product-call latency overlap the device's work), and the bf16 rates stand for
    fp16 too (Gram Newton–Schulz's dtype there; the tensor cores run both at one rate: 2%
    apart on the H100 of muon_compile.matmul_rates)."""
    kind = figures.get("kind", "cpu")  # runs saved before 2026-11-24 measured the CPU only
    dtypes = (torch.bfloat16, torch.float16) if kind == "cuda" else (torch.bfloat16,)
    bandwidth = figures["memory_bandwidth"]
    source = f"measured by scripts/measure_profiles.py, {world} ranks x {figures['threads']} threads, {kind}"
    rates = rates_of(figures, kind, dtypes, source, log)
    log(f"memory bandwidth (copy, read + write): {bandwidth / 1e9:.2f} GB/s")
    passes = figures.get("ns_pass_bandwidth", 0.0)  # runs saved before 2026-11-28's morning lack it
    if passes:
        log(f"Newton–Schulz passes: {passes / 1e9:.2f} GB/s")
    arithmetic = DeviceProfile(
        f"{kind}-w{world}",
        source,
        rates,
        memory_bandwidth=bandwidth,
        ns_pass_bandwidth=passes,
        overlaps_communication=kind != "cpu" or bool(network.compute_share),
        queues_kernels=kind != "cpu",
        shared_cores=cores if kind == "cpu" and world * figures["threads"] > cores else 0,
        rank_threads=figures["threads"],
    )
    host = arithmetic.queues_kernels and "fixed_host" in figures  # runs saved before 2026-11-27 lack it
    fitted = _fixed_costs(figures["fixed_host" if host else "fixed"], arithmetic, network, world, per_collective, log, host)
    log(f"fixed costs: {', '.join(f'{s * 1e6:.1f} us per {FIXED_COSTS[name]}' for name, s in fitted.items())}")
    return dataclasses.replace(arithmetic, **fitted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_backend_argument(parser)
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    start_backend(parser, args)
    world, rank = dist.get_world_size(), dist.get_rank()
    log = print if rank == 0 else (lambda *_: None)
    log(f"# {args.backend}, world {world}, torch {torch.__version__}, {machine()}, {torch.get_num_threads()} threads per rank")
    points, cpu = measure_network(args.reps)
    measured = cpu and world > 1
    after, alone = (measure_after_compute(args.reps), measure_after_compute(args.reps, alone=True)) if measured else (None, None)
    network = network_profile(points, world, args.backend, log, cpu, after, alone)
    per_collective = not collectives_wait_behind_compute(args.backend, args.realtime_gloo)
    device_profile(measure_device(args.reps), network, world, log, per_collective, (cpu or {}).get("cores", 0))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

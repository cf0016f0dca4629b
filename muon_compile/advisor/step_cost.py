"""The cost model: a distributed Muon step's predicted time, from its plan alone.

Input: the distribution plan (:func:`muon_compile.passes.distribute.plan.plan_distributed`,
which needs shapes only, so any world size can be planned without a process), the
prefetch depth, a :class:`DeviceProfile` and a
:class:`~muon_compile.advisor.network_profiles.NetworkProfile`. Output: a :class:`StepCost` per
rank: Newton–Schulz matmul seconds, pointwise (memory-bound) seconds, communication
seconds, the part of it not hidden behind compute, the device's wait for its host's
launches, and the total.

Work per bucket (docs/design.md, "Distributed layout"):

* launch: pack the local shards (read in the parameter dtype, write in the compute
  dtype), then the first collective;
* compute: wait, reassemble the owned matrices, Newton–Schulz per matrix (its products
  priced by :mod:`muon_compile.ns.cost` with the device's matmul rates, the algorithm
  that ``auto`` would choose, and per call the latency of its product calls; its
  memory-bound passes, :func:`~muon_compile.ns.cost.pointwise_bytes`, as pointwise
  work at the device's bandwidth for them, :attr:`DeviceProfile.ns_passes`), cut the
  results back into shards, the return collective (``all_to_all``);
* finish (``all_to_all``): wait, unpack;
* and per parameter, outside the buckets, the momentum and the update: read the
  gradient, read and write the momentum and the parameter;
* the step's fixed costs (:data:`FIXED_COSTS`): the device's overhead per step, per
  parameter, per NS call and per bucket, host time (counted as pointwise time where the
  host computes), and per collective, counted as the collective's time.

Timeline: the update first (its host costs, the step's guards and the parameters'
unwrapping, come before any kernel; the packing is fused into it), then the buckets'
stages in the order of the ``schedule`` pass
(:func:`~muon_compile.passes.schedule.stage_order`), each rank's compute on its own
clock, the collectives on one shared communication clock: a collective starts when the
last rank has issued it and the previous one is done, and a rank that waits for it
stalls. Where ranks share cores (the CPU), they end a stretch of the same compute at
different times: a collective starts the network profile's cost after that stretch
(:meth:`~muon_compile.advisor.network_profiles.NetworkProfile.after`, of the longest
stretch of any rank since its last collective issued or waited for, by how many ranks
computed it: their stretches' sum over the longest) after the last rank issued it, and
every rank's compute loses that time, waiting for the last. Where a collective's own work
runs on the compute cores (the CPU: gloo's threads), each rank's compute loses the
network profile's share of the collective's time at its issue
(:meth:`~muon_compile.advisor.network_profiles.NetworkProfile.share`); on a device that
cannot overlap communication with compute at all
(:attr:`DeviceProfile.overlaps_communication` false: a CPU profile without the
collectives' share, as :mod:`muon_compile.advisor.calibrate` writes it) a collective
holds every rank's compute clock to its end instead.
Exposed communication is the time a rank's compute waits for collectives or loses to
them.

Ranks that share cores (:attr:`DeviceProfile.shared_cores`: three one-thread ranks on
two cores) are priced at the rates of every rank computing at once; within a stage, where
some ranks have less work than others (``all_to_all``'s owners), the ranks done first
leave their cores to the rest, which then run faster (:meth:`DeviceProfile.speed`; the
stage's ranks taken to start together).

Host and device: every stage's seconds are split into the host's (the fixed costs, the
product calls' latency: dispatching and launching) and the device's (arithmetic, memory
traffic). Where the host computes (the CPU) they add. Where it queues kernels for the
device (a CUDA stream, :attr:`DeviceProfile.queues_kernels`), each rank also keeps a host
clock, which runs ahead of its device: a stage ends on the device at the later of its
device work done after the previous stage and its last launch, so host time is paid only
where the device would otherwise idle (reported as ``launch_bound``); waits for
collectives hold the device, not the host.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import NamedTuple

from ..config import Strategy
from ..ns.cost import call_latency, choose, pointwise_bytes, predicted_seconds
from ..ns.matmul_rates import PROFILES as MATMUL_PROFILES
from ..ns.matmul_rates import MatmulRates
from ..passes.distribute.plan import EVERY_RANK, DistBucket, DistMember, DistPlan
from ..passes.distribute.stages import Stage, StageTag
from ..passes.schedule import stage_order
from .network_profiles import NetworkProfile

# Elementwise passes of the momentum and the update, in parameter-sized tensors: read the
# gradient, read and write the momentum, read and write the parameter.
UPDATE_ACCESSES = 5

# Two configurations predicted closer than this (relative) are a tie: the model cannot rank
# them. Measured against steps at three CPU ranks on two cores, it prices the all_gather
# step 5-10% low against the all_to_all one (docs/advisor.md); the advisor names the ties
# of its recommendation.
TIE = 0.10


# The fixed costs of a compiled step: each a DeviceProfile field (seconds), and what it is
# counted by.
FIXED_COSTS = {
    "step_overhead": "step",
    "param_overhead": "parameter",
    "call_overhead": "NS call",
    "bucket_overhead": "bucket",
    "collective_overhead": "collective",
}


def tied(a: float, b: float) -> bool:
    """Whether predicted step times ``a`` and ``b`` lie within :data:`TIE` of each other
    (the slower over the faster)."""
    return max(a, b) <= min(a, b) * (1 + TIE)


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """What a device computes at: matmul rates, memory bandwidth (bytes/s) for
    pointwise work, whether collectives overlap compute on it (less the network profile's
    share of its compute that they take, see the module docstring), whether its host queues the
    kernels (``queues_kernels``: a CUDA stream; then host time overlaps the device's work,
    see the module docstring; on the CPU the host computes), and the fixed costs of a
    compiled step on it: ``step_overhead`` seconds per call (guards, the runtime wrapper),
    ``param_overhead`` seconds per parameter (unwrapping it, its share of the update's
    kernels), ``call_overhead`` seconds per Newton–Schulz call (the launches of its
    matmul and pointwise kernels, which the rates of large batched products leave out),
    ``bucket_overhead`` seconds per bucket (packing, its stages' dispatch) and
    ``collective_overhead`` seconds per collective, beyond its transfer as the network
    profile prices it back to back (on the CPU, gloo's threads woken behind the step's
    compute), counted as the collective's time (:data:`FIXED_COSTS`; none of them is
    measured by :mod:`muon_compile.advisor.calibrate`, docs/advisor.md); ``memory``, its
    bytes (0: unknown).
    ``ns_pass_bandwidth``: the bytes/s of the Newton–Schulz calls' own memory-bound passes
    (:func:`~muon_compile.ns.cost.pointwise_bytes`; 0: ``memory_bandwidth``, as a copy): on
    one CPU thread they convert bf16 both ways, divide and build the identity from an index,
    and ran at 0.67x a copy's bandwidth (docs/advisor.md).
    ``shared_cores``: the cores the ranks of a process group share, each rank computing
    on ``rank_threads`` threads (0: each rank has cores of its own): its rates and costs
    are those of every rank computing at once, and where fewer do, each runs faster
    (:meth:`speed`)."""

    name: str
    source: str
    matmul: MatmulRates
    memory_bandwidth: float
    overlaps_communication: bool
    queues_kernels: bool = False
    step_overhead: float = 0.0
    param_overhead: float = 0.0
    call_overhead: float = 0.0
    bucket_overhead: float = 0.0
    collective_overhead: float = 0.0
    memory: float = 0.0
    shared_cores: int = 0
    rank_threads: int = 1
    ns_pass_bandwidth: float = 0.0

    @property
    def ns_passes(self) -> float:
        """The bytes/s of the Newton–Schulz calls' memory-bound passes (``ns_pass_bandwidth``)."""
        return self.ns_pass_bandwidth or self.memory_bandwidth

    def speed(self, computing: int, world: int) -> float:
        """How much faster than at its profile's rates each of ``computing`` ranks of
        ``world`` computes when the others do not: the cores each gets, over those it gets
        when all ``world`` compute (1 without :attr:`shared_cores`)."""
        if not self.shared_cores:
            return 1.0
        cores = self.shared_cores / self.rank_threads
        return min(1.0, cores / computing) / min(1.0, cores / world)


DEVICES: dict[str, DeviceProfile] = {
    "h100": DeviceProfile(
        "h100",
        "the matmul rates of muon_compile.ns.matmul_rates 'cuda' (measured on one H100 80GB HBM3); "
        "HBM3 3.35 TB/s peak, 2.8 TB/s taken as achieved (2.79 measured), 80 GB; NCCL runs on its own stream; "
        "fixed costs, estimates, host time that the GPU's queued work hides: 50 us per step (a compiled call "
        "without CUDA graphs), 10 us per parameter, 100 us per NS call (about 20 kernel launches of ~5 us) and "
        "50 us per bucket, the launches of its collectives included (none per collective beyond them)",
        MATMUL_PROFILES["cuda"],
        memory_bandwidth=2.8e12,
        overlaps_communication=True,
        queues_kernels=True,
        step_overhead=50e-6,
        param_overhead=10e-6,
        call_overhead=100e-6,
        bucket_overhead=50e-6,
        memory=80e9,
    ),
}


@dataclasses.dataclass(frozen=True)
class StepCost:
    """Predicted seconds of one step, per rank (tuples indexed by rank in the group):
    ``total`` is ``ns + pointwise + exposed + launch_bound``, where ``ns`` is the
    Newton–Schulz products' time, ``pointwise`` the rest of the rank's own work (memory
    traffic, and on a device that does not queue kernels the fixed costs), ``exposed`` the
    communication it waits for and ``launch_bound`` the time its device waits for the host
    to launch the next kernels (0 where the host computes); ``communication`` is the
    collectives' time, overlapped or not; ``host`` each rank's host seconds (its fixed
    costs and product-call latency: within ``pointwise`` and ``ns`` where the host
    computes, the time to issue the step where it queues kernels)."""

    ns: tuple[float, ...]
    pointwise: tuple[float, ...]
    communication: float
    exposed: tuple[float, ...]
    total: tuple[float, ...]
    launch_bound: tuple[float, ...]
    host: tuple[float, ...]

    @property
    def step(self) -> float:
        """The step's time: its slowest rank's."""
        return max(self.total)

    @property
    def slowest_rank(self) -> int:
        """The rank whose total is the step (the first of equals)."""
        return self.total.index(self.step)


def _ranks(member: DistMember, world: int) -> range | tuple[int]:
    """The ranks that orthogonalise ``member``."""
    return range(world) if member.owner == EVERY_RANK else (member.owner,)


def _calls(bucket: DistBucket) -> list[dict[tuple[int, int], DistMember]]:
    """Each rank's Newton–Schulz calls in ``bucket``: one per canonical shape it
    orthogonalises, each with a member of that shape."""
    calls: list[dict[tuple[int, int], DistMember]] = [{} for _ in range(bucket.group_size)]
    for m in bucket.members:
        for r in _ranks(m, bucket.group_size):
            calls[r].setdefault(m.canonical, m)
    return calls


def _owned_elements(bucket: DistBucket) -> list[int]:
    """Elements of the whole matrices each rank orthogonalises in ``bucket``."""
    owned = [0] * bucket.group_size
    for m in bucket.members:
        for r in _ranks(m, bucket.group_size):
            owned[r] += m.slot * bucket.group_size
    return owned


def buffer_bytes(plan: DistPlan, prefetch: int) -> int:
    """An estimate of the peak bytes of the step's bucket buffers on its busiest rank,
    beyond the parameters, gradients and momentum, in the compute dtype, as the compiled
    step holds them (measured as docs/advisor.md describes):

    1. From the step's start, every bucket's packed shard, to be sent: Inductor fuses the
       packing into the momentum update, which runs first. It is freed once the bucket's
       collective is done.
    2. While bucket ``k`` is orthogonalised, the whole matrices received for it and for
       the ``prefetch`` buckets after it, and two more copies of its own (the iterate,
       and the result: under ``all_to_all`` the buffer that sends it back, which its
       padding is written into).

    The peak is the largest over ``k``, on the rank where it is largest."""
    itemsize = [b.args.compute_dtype.itemsize for b in plan.buckets]
    shards = [size * sum(m.slot for m in b.members) for size, b in zip(itemsize, plan.buckets)]  # alike on every rank
    unsent = list(itertools.accumulate(reversed(shards), initial=0))[::-1]  # unsent[k]: buckets k onward
    per_rank = zip(*([size * o for o in _owned_elements(b)] for size, b in zip(itemsize, plan.buckets)))
    peak = 0
    for owned in per_rank:
        received = list(itertools.accumulate(owned, initial=0))  # received[k]: buckets before k
        for k, own in enumerate(owned):
            in_flight = received[min(k + prefetch + 1, len(owned))] - received[k]
            peak = max(peak, unsent[k + 1] + in_flight + 2 * own)
    return peak


def _algorithms(bucket: DistBucket, rates: MatmulRates) -> dict[tuple[int, int], str]:
    """The Newton–Schulz algorithm ``auto`` picks on the device of ``rates`` for each
    ``(rows, cols)`` of ``bucket``'s members, chosen once per shape."""
    args = bucket.args
    shapes = dict.fromkeys((m.rows, m.cols) for m in bucket.members)
    return {(r, c): choose(r, c, args.steps, args.compute_dtype, rates.device, args.algorithm).algorithm for r, c in shapes}


def _per_rank(bucket: DistBucket, of_shape) -> list[float]:
    """Per rank, ``of_shape(rows, cols)`` summed over the matrices it orthogonalises in
    ``bucket``, each shape's value computed once."""
    value: dict[tuple[int, int], float] = {}
    total = [0.0] * bucket.group_size
    for m in bucket.members:
        if (m.rows, m.cols) not in value:
            value[m.rows, m.cols] = of_shape(m.rows, m.cols)
        for r in _ranks(m, bucket.group_size):
            total[r] += value[m.rows, m.cols]
    return total


class Seconds(NamedTuple):
    """One rank's seconds of a piece of the step: its host's (dispatching, launching: the
    fixed costs, the product calls' latency) and its device's (arithmetic, memory traffic)."""

    host: float
    device: float


def _ns_seconds(
    bucket: DistBucket, rates: MatmulRates, algorithms: dict[tuple[int, int], str], calls: list[dict[tuple[int, int], DistMember]]
) -> tuple[Seconds, ...]:
    """Each rank's NS seconds in ``bucket``: on the device, the arithmetic of its
    matrices, each with its ``algorithms`` entry (:func:`_algorithms`); on the host, the
    latency of the products of its ``calls`` (:func:`_calls`)."""
    args = bucket.args
    total = _per_rank(bucket, lambda r, c: predicted_seconds(algorithms[r, c], r, c, args.steps, args.compute_dtype, rates))
    first: dict[tuple[int, int], DistMember] = {}  # per canonical shape, the member its calls are priced by
    for rank_calls in (calls if rates.latency else ()):
        for shape, m in rank_calls.items():
            first.setdefault(shape, m)
    latency = {
        shape: call_latency(algorithms[m.rows, m.cols], m.rows, m.cols, args.steps, args.compute_dtype, rates)
        for shape, m in first.items()
    }
    return tuple(Seconds(sum(latency.get(shape, 0.0) for shape in rank_calls), t) for t, rank_calls in zip(total, calls))


@dataclasses.dataclass(frozen=True)
class _BucketWork:
    """One bucket's seconds per rank: its stages' (the compute stage's with its NS), its
    NS alone; and each of its collectives' kind and seconds back to back, and of those the
    seconds each rank's compute loses to it
    (:meth:`~muon_compile.advisor.network_profiles.NetworkProfile.share`)."""

    launch: tuple[Seconds, ...]
    compute: tuple[Seconds, ...]
    finish: tuple[Seconds, ...]
    ns: tuple[Seconds, ...]
    kinds: tuple[str, ...]
    collectives: tuple[float, ...]
    taken: tuple[float, ...]


def _bucket_work(bucket: DistBucket, device: DeviceProfile, network: NetworkProfile, param_itemsize: int) -> _BucketWork:
    world, bw = bucket.group_size, device.memory_bandwidth
    itemsize = bucket.args.compute_dtype.itemsize
    shard_elems = sum(m.slot for m in bucket.members)  # this rank's padded shards, packed
    pack = shard_elems * (param_itemsize + itemsize) / bw
    calls = _calls(bucket)
    algorithms = _algorithms(bucket, device.matmul)
    ns = _ns_seconds(bucket, device.matmul, algorithms, calls)
    owned = _owned_elements(bucket)
    # reassemble (read, write) and, for all_to_all, cut back into shards (read, write); the
    # Newton–Schulz calls' own memory-bound passes (ns_cost.pointwise_bytes)
    cuts = 2 if bucket.strategy is Strategy.ALL_TO_ALL else 1
    args = bucket.args
    ns_passes = _per_rank(bucket, lambda r, c: pointwise_bytes(algorithms[r, c], r, c, args.steps, args.compute_dtype))
    compute = tuple(
        Seconds(n.host + len(c) * device.call_overhead, n.device + cuts * 2 * e * itemsize / bw + p / device.ns_passes)
        for n, e, p, c in zip(ns, owned, ns_passes, calls)
    )
    finish = pack if bucket.strategy is Strategy.ALL_TO_ALL else 0.0
    overhead = device.collective_overhead if world > 1 else 0.0  # a group of one exchanges nothing
    kinds = [kind for kind, _, _ in bucket.collectives()]
    seconds = tuple(network.seconds(kind, shard_elems * itemsize, world) + overhead for kind in kinds)
    taken = tuple(network.share(kind, shard_elems * itemsize) * t for kind, t in zip(kinds, seconds))
    launch = Seconds(device.bucket_overhead, pack)
    return _BucketWork((launch,) * world, compute, (Seconds(0.0, finish),) * world, ns, tuple(kinds), seconds, taken)


def _shared(amounts: list[float], speed) -> list[float]:
    """Each rank's seconds to do its ``amounts`` (seconds at the rates of every rank
    computing at once), all starting together, where each of ``k`` ranks still computing
    runs ``speed(k)`` times as fast: the ranks done first leave their cores to the others."""
    seconds = [0.0] * len(amounts)
    t = done = 0.0
    for rank in sorted(range(len(amounts)), key=amounts.__getitem__):
        if amounts[rank] > done:
            computing = sum(a > done for a in amounts)
            t += (amounts[rank] - done) / speed(computing)
            done = amounts[rank]
        seconds[rank] = t
    return seconds


def _stages(plan: DistPlan, prefetch: int) -> list[StageTag]:
    """The order the ``schedule`` pass gives the stages of ``plan``'s buckets at ``prefetch``
    (:func:`~muon_compile.passes.schedule.stage_order`), as :func:`predict` runs them."""
    finish = any(b.strategy is Strategy.ALL_TO_ALL for b in plan.buckets)
    return stage_order(len(plan.buckets), finish, prefetch)


def predict(
    plan: DistPlan,
    prefetch: int,
    device: DeviceProfile,
    network: NetworkProfile,
    param_itemsize: int = 4,
) -> StepCost:
    """The predicted :class:`StepCost` of the buckets of ``plan`` (one process group)
    scheduled with ``prefetch`` (see the module docstring); parameters of
    ``param_itemsize`` bytes (fp32 by default)."""
    groups = {b.group_name for b in plan.buckets}
    if len(groups) > 1:
        raise ValueError(f"predict prices one process group's buckets; the plan has {sorted(groups)}")
    if not plan.buckets:
        return StepCost((0.0,), (0.0,), 0.0, (0.0,), (0.0,), (0.0,), (0.0,))
    world = plan.buckets[0].group_size
    work = [_bucket_work(b, device, network, param_itemsize) for b in plan.buckets]
    clock = [0.0] * world  # each rank's compute clock (its device's)
    host = [0.0] * world  # each rank's host seconds (its clock, where it queues kernels)
    busy = [0.0] * world  # each rank's own compute
    idle = [0.0] * world  # each rank's device waiting for its host
    exposed = [0.0] * world  # each rank's waits for collectives
    ns = [0.0] * world  # each rank's NS: the products' arithmetic, and where the host computes, their calls' latency
    stretch = [0.0] * world  # each rank's compute since its last collective issued or waited for
    comm_free = 0.0
    done: dict[tuple[int, int], float] = {}  # (bucket, collective) -> end time

    def run(rank_seconds: tuple[Seconds, ...], of_ns: tuple[Seconds, ...] | None = None) -> None:
        if not device.queues_kernels:  # the host computes, on cores the ranks may share
            amounts = [s.host + s.device for s in rank_seconds]
            took = _shared(amounts, lambda k: device.speed(k, world)) if device.shared_cores else amounts
            for r, (a, t) in enumerate(zip(amounts, took)):
                host[r] += rank_seconds[r].host
                stretch[r] += t
                clock[r] += t
                busy[r] += t
                if of_ns:  # its part of the time, as sped up as the rest
                    ns[r] += (of_ns[r].host + of_ns[r].device) * (t / a if a else 1.0)
            return
        for r, s in enumerate(rank_seconds):
            host[r] += s.host
            stretch[r] += s.device
            ns[r] += of_ns[r].device if of_ns else 0.0
            # the device is never ahead of the host's launches: clock >= host
            worked = clock[r] + s.device
            clock[r] = max(worked, host[r])
            busy[r] += s.device
            idle[r] += clock[r] - worked

    def collective(b: int, i: int) -> None:
        nonlocal comm_free
        # the last rank to end the stretch before it comes this late, and the others wait:
        # by how many ranks computed it (in ranks of the longest stretch)
        longest = max(stretch)
        late = network.after(work[b].kinds[i], longest, sum(stretch) / longest if longest > 0 else world, world)
        start = max(max(clock) + late, comm_free)
        end = start + work[b].collectives[i]
        comm_free = end
        done[(b, i)] = end
        stretch[:] = [0.0] * world
        if not device.overlaps_communication:
            hold(end)
            return
        for r in range(world):  # the wait for the last rank; its threads' work on the compute cores
            clock[r] += late + work[b].taken[i]
            exposed[r] += late + work[b].taken[i]

    def hold(until: float) -> None:
        for r, c in enumerate(clock):
            if until > c:
                exposed[r] += until - c
                clock[r] = until

    def wait(b: int, i: int) -> None:
        hold(done[(b, i)])
        stretch[:] = [0.0] * world

    members = [m for b in plan.buckets for m in b.members]
    elems = sum(m.slot for m in members)  # the largest blocks
    update = UPDATE_ACCESSES * elems * param_itemsize / device.memory_bandwidth
    run((Seconds(device.step_overhead, 0.0),) * world)  # guards and the wrapper, before any launch
    run((Seconds(device.param_overhead * len(members), update),) * world)
    for tag in _stages(plan, prefetch):
        w = work[tag.bucket]
        if tag.stage is Stage.LAUNCH:
            run(w.launch)
            collective(tag.bucket, 0)
        elif tag.stage is Stage.COMPUTE:
            wait(tag.bucket, 0)
            run(w.compute, w.ns)
            if len(w.collectives) > 1:
                collective(tag.bucket, 1)
        else:
            wait(tag.bucket, 1)
            run(w.finish)
    communication = sum(s for w in work for s in w.collectives)
    pointwise = tuple(b - n for b, n in zip(busy, ns))
    return StepCost(tuple(ns), pointwise, communication, tuple(exposed), tuple(clock), tuple(idle), tuple(host))

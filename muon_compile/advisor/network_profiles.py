"""Collective times by kind, size and group: the network profile of the cost model.

Each collective of a process group of ``W`` ranks is priced with the alpha-beta model of
the ring and pairwise algorithms that NCCL and gloo use for large messages, ``b`` being
the bytes one rank contributes (its input):

==========================  ==================================  ============================
collective                  what each rank sends                 seconds
==========================  ==================================  ============================
``all_gather_into_tensor``  its input to W - 1 peers (ring)      ``(W-1) a + (W-1) b / B``
``all_to_all_single``       ``b`` in all, ``b / W`` kept         ``(W-1) a + (W-1)/W b / B``
``all_reduce``              reduce-scatter, then all-gather      ``2 (W-1) a + 2 (W-1)/W b / B``
``reduce_scatter_tensor``   ring                                 ``(W-1) a + (W-1)/W b / B``
==========================  ==================================  ============================

Here ``a`` is the latency of one step and ``B`` the bandwidth one rank sends at (NCCL's
"bus bandwidth"). The all-to-all's ``W - 1`` latencies are those of a pairwise exchange,
one peer after another; a profile whose exchanges overlap says how many at once
(:attr:`NetworkProfile.exchanges_in_flight`). A group that fits in one node uses the
intra-node link; a larger one is limited by the inter-node link. A measured profile may
give a kind its own intra-node link (``kinds``): gloo's algorithms differ by kind more
than one link describes. The all-to-all row assumes the uneven split sizes of a bucket
cost what even ones of the same total cost.

A link may price messages above a size by a second link (:attr:`Link.large`), as NCCL
prices each of its protocols by its own latency and bandwidth: on this project's VM
gloo's all_gather of 16 MiB per rank took 6-12 times its 4 MiB time, which no one line
through the small and the large messages describes (docs/advisor.md). A profile file
may give such a link by hand; :mod:`muon_compile.advisor.calibrate` fits one line per
kind.

Profiles (:data:`PROFILES`):

* ``nvlink-ib``: a DGX-H100-class cluster, from published figures, not measured here:
  8 GPUs per node on NVLink 4 / NVSwitch (450 GB/s per direction per GPU; nccl-tests
  report 460-480 GB/s bus bandwidth for a large all-reduce on 8 x H100 SXM5), and one
  400 Gb/s NDR InfiniBand adapter per GPU between nodes (50 GB/s line rate, 45 GB/s taken
  as achieved). Latencies: 10 us per step within a node, 20 us between nodes, typical
  small-message nccl-tests figures.

Where a collective's own work runs on the cores the step computes on (gloo's threads on the
CPU), it takes a share of them while it is in flight: :attr:`NetworkProfile.compute_share`
gives it per kind and size; the cost model charges each rank's compute that share of
the collective's time (:mod:`muon_compile.advisor.step_cost`). Where ranks share cores,
they also end a stretch of the same compute at different times, and every rank waits for
the last at the next collective: :attr:`NetworkProfile.after_compute` gives what a
collective costs after a stretch, beyond its time back to back. Neither is measured by
:mod:`muon_compile.advisor.calibrate` (a profile it writes has none: docs/advisor.md
says what they changed on this project's VM). A GPU's NCCL kernels take a few of its
SMs, which no profile here prices (0), and its ranks do not share cores.

A profile of the user's own cluster, one node or more, is measured by
``torchrun --nproc-per-node N -m muon_compile.advisor.calibrate --out PROFILE.json``
(:mod:`muon_compile.advisor.profiles` reads it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from ..ns.matmul_rates import interpolate

COLLECTIVES = ("all_gather_into_tensor", "all_to_all_single", "all_reduce", "reduce_scatter_tensor")


@dataclasses.dataclass(frozen=True)
class Link:
    """One kind of link: ``latency`` seconds per algorithm step, ``bandwidth`` bytes/s sent
    per rank; messages of more than ``large_from`` bytes per rank are priced by the link
    ``large`` instead (both or neither given)."""

    latency: float
    bandwidth: float
    large_from: float = math.inf
    large: Link | None = None

    def __post_init__(self) -> None:
        if (self.large is None) != math.isinf(self.large_from):
            raise ValueError(f"a link prices large messages by a second link from a size: both or neither, "
                             f"got large_from={self.large_from} and large={self.large}")

    def seconds(self, steps: float, factor: float, nbytes: float) -> float:
        """``steps * latency + factor * nbytes / bandwidth`` by the link of ``nbytes``' size."""
        if nbytes > self.large_from:
            return self.large.seconds(steps, factor, nbytes)
        return steps * self.latency + factor * nbytes / self.bandwidth

    def describe(self) -> str:
        """Its latency and bandwidth, and those of its large messages' link."""
        bandwidth = "unbounded" if math.isinf(self.bandwidth) else f"{self.bandwidth / 1e9:.3f} GB/s"
        own = f"latency {self.latency * 1e6:.1f} us, bandwidth {bandwidth}"
        if self.large is None:
            return own
        return f"{own} up to {self.large_from / 1024:.0f} KiB, above: {self.large.describe()}"


def _after(points: tuple[tuple[float, float], ...] | None, stretch: float) -> float:
    """The cost of ``points`` (``(seconds of compute, seconds)``) after ``stretch``: linear
    between them and from none after no compute, flat beyond the last; 0 without points."""
    if not points or stretch <= 0:
        return 0.0
    for (s0, e0), (s1, e1) in zip(((0.0, 0.0), *points), points):
        if stretch <= s1:
            return e0 + (stretch - s0) / (s1 - s0) * (e1 - e0)
    return points[-1][1]


@dataclasses.dataclass(frozen=True)
class NetworkProfile:
    """The links of a cluster: ``intra`` within a node of ``ranks_per_node`` ranks (or
    ``kinds[kind]`` for a collective kind that has its own), ``inter`` between nodes;
    ``source`` says where the figures come from. ``exchanges_in_flight``: how many of an
    all-to-all's ``W - 1`` peer exchanges overlap their latencies; it pays
    ``ceil((W - 1) / exchanges_in_flight)`` latencies (1, the default: the pairwise
    exchange of the table, one peer after another, as gloo runs it; NCCL issues the
    exchanges as grouped sends and receives that overlap, by how much no published figure
    says, so the advisor shows both bounds). ``compute_share``: per kind, ``(bytes per
    rank, share)`` points in increasing size: the share of each rank's compute that a
    collective of that kind takes while it is in flight (its threads' work on the same
    cores), interpolated in log size and flat beyond the ends (:meth:`share`); a kind
    without points takes none. ``after_compute``: per kind, ``(seconds of compute,
    seconds)`` points in increasing compute: what a collective of that kind costs beyond
    its time back to back when every rank issues it after that long a stretch of compute
    (ranks that share cores end a stretch at different times, and the first waits for the
    last), linear between the points and from none after no compute, flat beyond the last
    (:meth:`after`); a kind without points costs nothing more. ``after_compute_alone``:
    the same, where one rank alone computed the stretch and the others waited at the
    collective (a tenth of the other at world 3 on two cores: the three ranks' shares of
    the cores make the cost, docs/advisor.md); a kind without points costs as
    ``after_compute`` says, however few ranks computed."""

    name: str
    source: str
    intra: Link
    inter: Link
    ranks_per_node: int
    kinds: Mapping[str, Link] = dataclasses.field(default_factory=dict)
    exchanges_in_flight: int = 1
    compute_share: Mapping[str, tuple[tuple[float, float], ...]] = dataclasses.field(default_factory=dict)
    after_compute: Mapping[str, tuple[tuple[float, float], ...]] = dataclasses.field(default_factory=dict)
    after_compute_alone: Mapping[str, tuple[tuple[float, float], ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        kinds = set(self.kinds) | set(self.compute_share) | set(self.after_compute) | set(self.after_compute_alone)
        if unknown := kinds - set(COLLECTIVES):
            raise ValueError(f"network profile {self.name!r}: unknown collective kinds {sorted(unknown)}; known: {COLLECTIVES}")
        if self.exchanges_in_flight < 1:
            raise ValueError(f"network profile {self.name!r}: exchanges_in_flight must be >= 1, got {self.exchanges_in_flight}")
        for kind, points in self.compute_share.items():
            if not points or any(not 0.0 <= share <= 1.0 for _, share in points):
                raise ValueError(f"network profile {self.name!r}: compute_share[{kind!r}] must be points with "
                                 f"shares in [0, 1], got {points}")
        for field, costs in (("after_compute", self.after_compute), ("after_compute_alone", self.after_compute_alone)):
            for kind, points in costs.items():
                stretches = [s for s, _ in points]
                if not points or stretches[0] <= 0 or stretches != sorted(set(stretches)) or any(e < 0 for _, e in points):
                    raise ValueError(f"network profile {self.name!r}: {field}[{kind!r}] must be points of "
                                     f"increasing positive seconds of compute and seconds >= 0, got {points}")

    def share(self, kind: str, nbytes: float) -> float:
        """The share of each rank's compute that collective ``kind`` with ``nbytes`` of input
        per rank takes while it is in flight (see :attr:`compute_share`)."""
        points = self.compute_share.get(kind)
        return interpolate(points, nbytes) if points else 0.0

    def after(self, kind: str, stretch: float, computing: float = 0.0, world: int = 0) -> float:
        """Seconds collective ``kind`` costs beyond its time back to back when the ranks
        issue it after ``stretch`` seconds of compute (see :attr:`after_compute`): of
        ``world`` ranks, ``computing`` computed it (in ranks of the longest stretch: their
        stretches' sum over the longest), linear between the cost with one rank computing
        (:attr:`after_compute_alone`, where the profile has it) and with every rank (0:
        every rank)."""
        every = _after(self.after_compute.get(kind), stretch)
        alone = self.after_compute_alone.get(kind)
        if not alone or not computing or world < 2:
            return every
        one = _after(alone, stretch)
        return one + (every - one) * (min(computing, world) - 1) / (world - 1)

    def link(self, group_size: int, kind: str | None = None) -> Link:
        """The link a group of ``group_size`` ranks (placed on consecutive ranks) is limited
        by; within a node, ``kind``'s own link where the profile has one."""
        if group_size > self.ranks_per_node:
            return self.inter
        return self.kinds.get(kind, self.intra)

    def seconds(self, kind: str, nbytes: float, group_size: int) -> float:
        """Predicted seconds of collective ``kind`` with ``nbytes`` of input per rank over
        ``group_size`` ranks (see the module docstring); 0 for a group of one."""
        steps, factor = alpha_beta(kind, group_size)
        if group_size <= 1:
            return 0.0
        if kind == "all_to_all_single":
            steps = math.ceil(steps / self.exchanges_in_flight)
        return self.link(group_size, kind).seconds(steps, factor, nbytes)


def alpha_beta(kind: str, group_size: int) -> tuple[float, float]:
    """``(steps, factor)`` of collective ``kind`` over ``group_size`` ranks: it takes
    ``steps * latency + factor * input bytes / bandwidth`` (the table of the module docstring)."""
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}; known: {COLLECTIVES}")
    w = group_size
    if kind == "all_gather_into_tensor":
        return w - 1, w - 1
    if kind == "all_reduce":
        return 2 * (w - 1), 2 * (w - 1) / w
    return w - 1, (w - 1) / w


PROFILES: dict[str, NetworkProfile] = {
    "nvlink-ib": NetworkProfile(
        "nvlink-ib",
        "published figures (DGX H100: NVLink 4 450 GB/s per direction, nccl-tests 460-480 GB/s bus "
        "bandwidth on 8 x H100 SXM5; NDR 400 Gb/s InfiniBand per GPU), not measured here",
        intra=Link(latency=10e-6, bandwidth=450e9),
        inter=Link(latency=20e-6, bandwidth=45e9),
        ranks_per_node=8,
    ),
}


def profile(name: str) -> NetworkProfile:
    """The network profile called ``name``; ``ValueError`` naming the known ones otherwise."""
    if name not in PROFILES:
        raise ValueError(f"unknown network profile {name!r}; known: {sorted(PROFILES)}")
    return PROFILES[name]

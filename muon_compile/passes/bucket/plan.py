"""plan_buckets: group single-device Newton–Schulz sites into buckets. Plain data in and out.

Algorithm (:func:`plan_buckets`, one batched NS call per bucket):
  1. Set aside sites that ``find`` marked unbucketable (each keeps its own NS call).
  2. Key the rest by (dtype, device, NS arguments, level): only equal keys may share a
     bucket (a site fed by another site's result never joins that site's bucket).
  3. Canonical orientation: a tall ``r x c`` matrix (r > c) joins as its ``c x r`` transpose,
     so it shares a bucket with wide ones, unless the device's measured table has the
     textbook iteration faster on tall matrices kept in their own layout
     (:func:`muon_compile.ns.cost.choose_orientation`: ``native``, this project's CPU, for a
     site whose algorithm resolves to the textbook one, as ``lower`` resolves it): it then
     joins as it is, with tall matrices only.
  4. Shapes, largest NS FLOPs first, each join the existing bucket shape that covers them
     (both dims >=) with the least zero-padding waste, if that waste is at most
     ``pad_waste`` (a fraction of the padded matrix's NS FLOPs); otherwise they open a new
     bucket shape. Zero rows / columns commute with the iteration and keep the norm.
  5. Members in graph order fill buckets up to ``bucket_mb`` MiB of stacked input (in
     the compute dtype); a larger single site gets a bucket of its own.
  6. Buckets are ordered by their first member's position in the graph.

Before / after: sites ``[48x16, 16x16, 16x48, 16x16]`` (no padding) become buckets
``[16x48: (0 transposed, 2), 16x16: (1, 3)]``, and where tall matrices keep their layout
``[48x16: (0), 16x16: (1, 3), 16x48: (2)]``.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import torch

from muon_compile.ns.args import TEXTBOOK, NSArgs
from muon_compile.ns.cost import TRANSPOSED, choose, choose_orientation, ns_flops

from ..find import NSSite


@dataclasses.dataclass(frozen=True)
class Member:
    """A site inside a bucket: its matrices enter as ``rows x cols`` (transposed if ``transpose``)."""

    site: int
    batch: int
    rows: int
    cols: int
    transpose: bool


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One batched NS call on ``sum(batch)`` matrices zero-padded to ``rows x cols``."""

    rows: int
    cols: int
    members: tuple[Member, ...]
    args: NSArgs
    itemsize: int

    @property
    def matrices(self) -> int:
        return sum(m.batch for m in self.members)

    @property
    def padded(self) -> bool:
        return any((m.rows, m.cols) != (self.rows, self.cols) for m in self.members)

    @property
    def nbytes(self) -> int:
        return self.matrices * self.rows * self.cols * self.itemsize

    @property
    def flops(self) -> int:
        return self.matrices * ns_flops(self.rows, self.cols, self.args.steps)

    @property
    def rewrites(self) -> bool:
        """Whether the bucket changes the graph (a lone, unpadded site keeps its own call)."""
        return len(self.members) > 1 or self.padded


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    buckets: tuple[Bucket, ...]
    skipped: tuple[tuple[int, str], ...]

    def describe(self) -> str:
        """A human-readable summary, one line per bucket."""
        lines = [
            f"bucket {i}: {b.matrices} x {b.rows}x{b.cols} {b.args.compute_dtype} "
            f"{b.nbytes / 2**20:.2f} MiB, sites {[m.site for m in b.members]}"
            + (" (padded)" if b.padded else "")
            for i, b in enumerate(self.buckets)
        ]
        lines += [f"site {s} not bucketed: {reason}" for s, reason in self.skipped]
        return "\n".join(lines)


def _canonical(site: NSSite, orientation: str, algorithm: str) -> Member:
    """``site`` as a member: wide, or tall where its textbook iteration keeps the tall layout
    (``orientation``, ``algorithm``: the settings ``lower`` resolves the same way)."""
    args, device = site.args, torch.device(site.device).type
    layout = TRANSPOSED  # the Gram iteration's
    if choose(site.rows, site.cols, args.steps, args.compute_dtype, device, args.algorithm, algorithm).algorithm == TEXTBOOK:
        layout = choose_orientation(site.rows, site.cols, args.compute_dtype, device, orientation).kind
    transpose = site.rows > site.cols and layout == TRANSPOSED
    rows, cols = (site.cols, site.rows) if transpose else (site.rows, site.cols)
    return Member(site.index, site.batch, rows, cols, transpose)


def _padding_waste(shape: tuple[int, int], target: tuple[int, int], steps: int) -> float:
    return 1.0 - ns_flops(*shape, steps) / ns_flops(*target, steps)


def _assign_shapes(shapes: list[tuple[int, int]], steps: int, pad_waste: float) -> dict[tuple[int, int], tuple[int, int]]:
    """Map each canonical shape to the bucket shape it is padded to (step 4)."""
    targets: list[tuple[int, int]] = []
    assignment = {}
    for shape in sorted(set(shapes), key=lambda s: (-ns_flops(*s, steps), s)):
        fits = [
            (_padding_waste(shape, t, steps), t)
            for t in targets
            if t[0] >= shape[0] and t[1] >= shape[1]
        ]
        fits = [f for f in fits if f[0] <= pad_waste]
        if fits:
            assignment[shape] = min(fits)[1]
        else:
            targets.append(shape)
            assignment[shape] = shape
    return assignment


def _chunks(members: list[Member], rows: int, cols: int, itemsize: int, cap_bytes: float) -> list[list[Member]]:
    """Split members, in order, into runs whose stacked bytes stay within ``cap_bytes`` (step 5)."""
    runs: list[list[Member]] = []
    size = 0
    for m in members:
        nbytes = m.batch * rows * cols * itemsize
        if runs and size + nbytes <= cap_bytes:
            runs[-1].append(m)
            size += nbytes
        else:
            runs.append([m])
            size = nbytes
    return runs


def plan_buckets(
    sites: list[NSSite], *, bucket_mb: float, pad_waste: float, orientation: str = "auto", algorithm: str = "auto"
) -> BucketPlan:
    """Plan the buckets for ``sites`` (see the module docstring; ``orientation``:
    ``MUON_COMPILE_NS_ORIENTATION``, ``algorithm``: ``MUON_COMPILE_NS_ALGORITHM``)."""
    skipped = tuple((s.index, s.skip_reason) for s in sites if s.skip_reason is not None and s.sharding is None)
    by_key: dict[tuple, list[NSSite]] = defaultdict(list)
    for s in sites:
        if s.skip_reason is None and s.sharding is None:
            by_key[(s.dtype, s.device, s.args, s.level)].append(s)
    buckets = []
    for (_dtype, _device, args, _level), group in by_key.items():
        members = [_canonical(s, orientation, algorithm) for s in group]
        shape_of = _assign_shapes([(m.rows, m.cols) for m in members], args.steps, pad_waste)
        by_target: dict[tuple[int, int], list[Member]] = defaultdict(list)
        for m in members:
            by_target[shape_of[(m.rows, m.cols)]].append(m)
        itemsize = args.compute_dtype.itemsize  # the stack is built in the compute dtype
        for (rows, cols), ms in by_target.items():
            for run in _chunks(ms, rows, cols, itemsize, bucket_mb * 2**20):
                buckets.append(Bucket(rows, cols, tuple(run), args, itemsize))
    buckets.sort(key=lambda b: b.members[0].site)
    return BucketPlan(tuple(buckets), skipped)

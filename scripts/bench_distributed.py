"""Distributed benchmark of one Muon step on FSDP2 (DTensor ``Shard(0)``) parameters.

    torchrun --nproc-per-node 2 scripts/bench_distributed.py [--workload all] [--reps 7]
        [--backend gloo|nccl]

Every rank builds the same FSDP2-sharded fp32 matrices with fixed gradients: with gloo
(the default without one GPU per rank) on the CPU over 127.0.0.1, with nccl (the default
when there is one) on GPU ``LOCAL_RANK``; the values are drawn on the CPU from one seeded
generator and then moved, so both backends start from the same numbers. Arms, all in one
run, each on fresh parameters:

    eager-torch     eager torch.optim.Muon on the DTensor parameters
    inductor-torch  the same, torch.compile'd with the default backend
    muon-gather     muon_compile.Muon, backend="muon", MUON_COMPILE_STRATEGY=all_gather
    muon-a2a        muon_compile.Muon, backend="muon", MUON_COMPILE_STRATEGY=all_to_all
    muon-torch      unmodified torch.optim.Muon, backend="muon" (canonicalize), all_to_all
    hand-a2a        a hand-written owner-compute all-to-all Muon in Dion's style: same-shape
                    shards stacked, one all_to_all pair per shape, owners round-robin

An arm that fails (unmodified torch.optim.Muon cannot update a matrix with fewer rows
than ranks) is reported with its error and measured again on the workload without such
matrices. Per arm: the median over ``--reps`` steps (after ``--warmup``) of the slowest
rank's step time (a barrier before each step; on CUDA the wall clock from the barrier to
the end of a ``torch.cuda.synchronize()`` after the step, so queued GPU work counts), the
cold compile time (timed the same way), and from one profiled step on every rank (CPU-side
events): the backend's collectives per step (its ``gloo:``/``nccl:`` profiler events,
barriers excepted), bytes each rank sends per step (all_to_all: the rows it sends to other
ranks; all_gather: its input times W-1; all_reduce: 2(W-1)/W of its input;
reduce_scatter: (W-1)/W; "-" where a collective of another kind, or one recorded without
its inputs, such as ``nccl:coalesced``, makes the total unknown), and matmul FLOPs per rank.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch._inductor.utils import fresh_cache

from bench_single_device import cpu_model

import muon_compile
from muon_compile import config
from muon_compile.ns_cost import ns_flops

KELLER = (3.4445, -4.7750, 2.0315)
LR, MOMENTUM, NS_STEPS = 0.02, 0.95, 5
Shape = tuple[int, int]

_GPT_SMALL = [(1152, 384), (384, 384), (1536, 384), (384, 1536)] * 6
WORKLOADS: dict[str, list[Shape]] = {
    # gpt-small plus two matrices whose rows 2 does not divide and a single row
    "gpt-small": _GPT_SMALL + [(1001, 384), (383, 1536), (1, 384)],
    # 14 matrices of widths 64, 96 and 37
    "small-14": [(64, 96), (96, 64), (37, 64), (64, 37), (96, 96), (37, 96), (96, 37)] * 2,
}


# ---------------------------------------------------------------------------- devices
def on_gpu() -> bool:
    """Whether this run communicates with NCCL, each rank on its own GPU."""
    return dist.get_backend() == "nccl"


def rank_device() -> torch.device:
    """Where this rank's tensors live: its GPU under NCCL, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if on_gpu() else torch.device("cpu")


def sync() -> None:
    """Wait for this rank's queued GPU work (nothing is queued on the CPU)."""
    if on_gpu():
        torch.cuda.synchronize()


# ------------------------------------------------------------------------- parameters
class Stack(nn.Module):
    def __init__(self, shapes: list[Shape]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(i, o, bias=False) for o, i in shapes)


def sharded_params(shapes: list[Shape], mesh) -> list[nn.Parameter]:
    """FSDP2-sharded weights with fixed values and gradients, the same on every run.

    The values are drawn on the CPU (one seeded generator, whatever the backend) and then
    moved to this rank's device.
    """
    device = rank_device()
    gen = torch.Generator().manual_seed(0)
    model = Stack(shapes)
    with torch.no_grad():
        for layer in model.layers:
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.02)
    model.to(device)
    fully_shard(model, mesh=mesh)
    params = [layer.weight for layer in model.layers]
    for p in params:
        grad = torch.randn(p.shape, generator=gen).to(device)
        p.grad = distribute_tensor(grad, mesh, p.placements)
    return params


# ------------------------------------------------------------------------ hand-a2a arm
def _ns_batched(x: torch.Tensor) -> torch.Tensor:
    """Keller's quintic on a [K, m, n] bf16 batch, m <= n, as hand-written Muons do."""
    a, b, c = KELLER
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(NS_STEPS):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x


class HandAllToAllMuon:
    """Owner-compute Muon for FSDP2 written by hand (Dion's megabatch design).

    Parameters of one global shape form a group; matrix i of a group belongs to rank
    i % W. Each step: Nesterov momentum on the local shards; per group, stack the padded
    shards, one all_to_all to the owners, reassemble and orthogonalise the owned matrices
    in one batch, one all_to_all back, unpack and update.
    """

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        groups: dict[tuple, list[nn.Parameter]] = {}
        for p in params:
            groups.setdefault(tuple(p.shape), []).append(p)
        self.groups = list(groups.items())
        self.bufs = {p: torch.zeros_like(p.to_local()) for p in params}
        self.device = params[0].to_local().device

    @torch.no_grad()
    def step(self) -> None:
        for (rows, cols), params in self.groups:
            self._step_group(rows, cols, params)

    def _step_group(self, rows: int, cols: int, params: list[nn.Parameter]) -> None:
        w, rank = self.world, self.rank
        per = math.ceil(rows / w)
        slots = math.ceil(len(params) / w)  # matrices per owner, zero-padded
        send = torch.zeros(w, slots, per, cols, dtype=torch.bfloat16, device=self.device)
        for i, p in enumerate(params):
            g, buf = p.grad.to_local(), self.bufs[p]
            buf.lerp_(g, 1 - MOMENTUM)
            send[i % w, i // w, : g.size(0)] = g.lerp(buf, MOMENTUM)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        full = recv.permute(1, 0, 2, 3).reshape(slots, w * per, cols)[:, :rows]
        tall = rows > cols
        ortho = _ns_batched(full.mT if tall else full)
        ortho = ortho.mT if tall else ortho
        back = torch.zeros(slots, w * per, cols, dtype=torch.bfloat16, device=self.device)
        back[:, :rows] = ortho
        send_back = back.reshape(slots, w, per, cols).permute(1, 0, 2, 3).contiguous()
        dist.all_to_all_single(recv, send_back)
        scale = max(1.0, rows / cols) ** 0.5
        for i, p in enumerate(params):
            local = p.to_local()
            local.add_(recv[i % w, i // w, : local.size(0)].float(), alpha=-LR * scale)


# ------------------------------------------------------------------------------- arms
def torch_muon(params):
    return torch.optim.Muon(params, lr=LR, weight_decay=0.0).step


def our_muon(params):
    return muon_compile.Muon(params, lr=LR).step


def hand_a2a(params):
    return HandAllToAllMuon(params).step


ARMS: dict[str, tuple[str, Callable, str | None, str | None]] = {
    # key: (name, build step from params, torch.compile backend, MUON_COMPILE_STRATEGY)
    "eager-torch": ("eager torch.optim.Muon", torch_muon, None, None),
    "inductor-torch": ("inductor torch.optim.Muon", torch_muon, "inductor", None),
    "muon-gather": ("muon all_gather", our_muon, "muon", "all_gather"),
    "muon-a2a": ("muon all_to_all", our_muon, "muon", "all_to_all"),
    "muon-torch": ("muon torch.optim.Muon (all_to_all)", torch_muon, "muon", "all_to_all"),
    "hand-a2a": ("hand-written all_to_all", hand_a2a, None, None),
}


# -------------------------------------------------------------------------- measuring
def slowest(value: float) -> float:
    """The largest ``value`` over the ranks (an all-reduce on this rank's device)."""
    t = torch.tensor(value, dtype=torch.float64, device=rank_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _issued_and_done(step) -> tuple[float, float]:
    """This rank's seconds from a call of ``step``, after a barrier with its device idle,
    to the call's return and to the end of the GPU work it queued (the same on the CPU)."""
    sync()
    dist.barrier()
    start = time.perf_counter()
    step()
    issued = time.perf_counter() - start
    sync()
    return issued, time.perf_counter() - start


def timed(step) -> float:
    """Seconds of one ``step`` on the slowest rank, GPU work included, after a barrier."""
    return slowest(_issued_and_done(step)[1])


def timed_host(step) -> float:
    """Seconds the slowest rank's host takes to issue one ``step``, after a barrier, its
    device idle at the call: on a GPU, from the call to its return, the kernels it queued
    possibly still running (waited for before the next timing); on the CPU, the step."""
    return slowest(_issued_and_done(step)[0])


def timed_steps(step, warmup: int, reps: int) -> list[float]:
    for _ in range(warmup):
        step()
    return [timed(step) for _ in range(reps)]


_ELEMENT = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8}
MATMUL_OPERANDS = {"aten::mm": (0, 1), "aten::bmm": (0, 1), "aten::addmm": (1, 2), "aten::baddbmm": (1, 2)}
# the kind of a collective from its profiler event name after "<backend>:", lower case and
# without underscores: "_all_gather_base", "allgather", "all_gather_into_tensor_coalesced"
# are all all_gather ("all_reduce_barrier", a barrier, is dropped before)
_KINDS = {"alltoall": "all_to_all", "allgather": "all_gather", "reducescatter": "reduce_scatter", "allreduce": "all_reduce"}


def event_prefix() -> str:
    """The prefix of the backend's own collective events in the profiler: "gloo:" or "nccl:"."""
    return f"{dist.get_backend()}:"


def collective_kind(name: str, prefix: str) -> str | None:
    """all_to_all, all_gather, reduce_scatter or all_reduce for a collective event; None: other."""
    part = name[len(prefix) :].strip().lower().replace("_", "")
    return next((kind for key, kind in _KINDS.items() if key in part), None)


def _input_bytes(event) -> int | None:
    """Bytes of the tensors a collective event was recorded with; None if it has none."""
    sizes = [
        math.prod(shape) * _ELEMENT.get(dtype, 4)
        for shape, dtype in zip(event.input_shapes, event.input_dtypes)
        if dtype and all(isinstance(n, int) for n in shape)
    ]
    return sum(sizes) if sizes else None


def _sent_bytes(kind: str | None, nbytes: int | None, splits: list[int] | None, world: int, rank: int) -> float:
    """Bytes this rank sends in one collective of ``nbytes`` input (see the module docstring).

    NaN (unknown) for a kind other than the four, or an event recorded without its inputs.
    """
    if kind is None or nbytes is None:
        return math.nan
    if kind == "all_to_all":
        if splits:
            return sum(s for j, s in enumerate(splits) if j != rank) * nbytes / max(sum(splits), 1)
        return nbytes * (world - 1) / world
    if kind == "all_gather":
        return nbytes * (world - 1)
    if kind == "all_reduce":
        return 2 * (world - 1) / world * nbytes
    return (world - 1) / world * nbytes  # reduce_scatter


def profile_step(step, world: int, rank: int) -> dict:
    """Collectives, bytes sent (NaN: unknown) and matmul FLOPs of one step on this rank."""
    # the CPU-side events carry everything counted here, also under NCCL
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    sync()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    prefix = event_prefix()
    collectives = [e for e in events if e.name.startswith(prefix) and "barrier" not in e.name]
    # the backend's own events carry the sizes; all_to_all splits are on the c10d call, in the same order
    splits = iter([e.concrete_inputs[4] for e in events if e.name == "c10d::alltoall_base_"])
    sent = 0.0
    for e in collectives:
        kind = collective_kind(e.name, prefix)
        split = next(splits, None) if kind == "all_to_all" else None
        sent += _sent_bytes(kind, _input_bytes(e), split, world, rank)
    flops = 0
    for e in events:
        if e.name in MATMUL_OPERANDS:
            i, j = MATMUL_OPERANDS[e.name]
            a, b = e.input_shapes[i], e.input_shapes[j]
            flops += 2 * math.prod(a[:-2] or [1]) * a[-2] * a[-1] * b[-1]
    return {"collectives": len(collectives), "sent": sent, "flops": flops}


def failure(exc: Exception) -> str:
    """An arm's failure as its table row shows it: the exception's type and first line."""
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"


def measure(key: str, shapes: list[Shape], mesh, warmup: int, reps: int) -> dict:
    name, build, backend, strategy = ARMS[key]
    world, rank = dist.get_world_size(), dist.get_rank()
    result = {"arm": name}
    cache = fresh_cache() if backend else contextlib.nullcontext()
    strat = config.override(strategy=strategy) if strategy else contextlib.nullcontext()
    try:
        with cache, strat:
            torch._dynamo.reset()
            step = build(sharded_params(shapes, mesh))
            if backend:
                step = torch.compile(step, backend=backend)
                result["compile_s"] = timed(step)
            result["times"] = timed_steps(step, warmup, reps)
            stats = profile_step(step, world, rank)
        values = [stats["collectives"], stats["sent"], stats["flops"]]
        totals = torch.tensor(values, dtype=torch.float64, device=rank_device())
        per_rank = [torch.zeros_like(totals) for _ in range(world)]
        dist.all_gather(per_rank, totals)
        result["collectives"] = int(max(t[0].item() for t in per_rank))
        result["sent_mb"] = [t[1].item() / 2**20 for t in per_rank]
        result["gflop"] = [t[2].item() / 1e9 for t in per_rank]
    except Exception as exc:  # report and go on: the table shows the failure
        result["error"] = failure(exc)
        if rank == 0:
            traceback.print_exc(file=sys.stderr)
    finally:
        torch._dynamo.reset()
    return result


# ------------------------------------------------------------------------- reporting
def local_bytes(shapes: list[Shape], world: int, rank: int, itemsize: int = 2) -> float:
    """This rank's Muon-parameter shard bytes in the communication dtype (bf16)."""
    total = 0
    for rows, cols in shapes:
        per = math.ceil(rows / world)
        total += max(0, min(per, rows - rank * per)) * cols * itemsize
    return total


def row(result: dict) -> str:
    if "error" in result:
        return f"{result['arm']:<44} failed: {result['error']}"
    median = statistics.median(result["times"]) * 1e3
    compile_s = f"{result['compile_s']:.1f}" if "compile_s" in result else "-"
    sent = "/".join("-" if math.isnan(m) else f"{m:.3f}" for m in result["sent_mb"])
    flops = "/".join(f"{g:.2f}" for g in result["gflop"])
    return f"{result['arm']:<44} {median:9.2f} {min(result['times']) * 1e3:9.2f} {compile_s:>9} {result['collectives']:>6} {sent:>17} {flops:>17}"


def machine() -> str:
    """The CPU (its model, so that runs on different machines tell apart), and under NCCL
    the GPU and CUDA version, of this rank."""
    cpu = f"{cpu_model()}, {os.cpu_count()} cpus"
    if not on_gpu():
        return cpu
    return f"{cpu}, GPU {torch.cuda.get_device_name()} x{torch.cuda.device_count()}, CUDA {torch.version.cuda}"


def report(name: str, shapes: list[Shape], results: list[dict], reps: int, warmup: int) -> str:
    world = dist.get_world_size()
    expected = [2 * (world - 1) / world * local_bytes(shapes, world, r) / 2**20 for r in range(world)]
    ns = sum(ns_flops(r, c, NS_STEPS) for r, c in shapes) / 1e9
    lines = [
        f"=== {name}: {len(shapes)} fp32 matrices, {ns:.2f} GFLOP of NS per step, world {world} ({dist.get_backend()}) ===",
        f"machine: {machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads per rank; median of {reps} steps after {warmup} warm-up (slowest rank)",
        f"2(W-1)/W of each rank's local Muon-param bytes in bf16: {'/'.join(f'{m:.3f}' for m in expected)} MiB",
        "",
        f"{'arm':<44} {'step ms':>9} {'min ms':>9} {'compile s':>9} {'colls':>6} {'sent MiB/rank':>17} {'GFLOP/rank':>17}",
        *[row(r) for r in results],
    ]
    timed = {r["arm"]: statistics.median(r["times"]) for r in results if "times" in r}
    for ours in ("muon all_to_all", "muon all_gather"):
        if ours in timed:
            lines += [f"{ours} vs {k}: {v / timed[ours]:.2f}x" for k, v in timed.items() if k != ours]
    return "\n".join(lines)


def default_backend() -> str:
    """nccl when CUDA has a GPU for every rank (torchrun's ``WORLD_SIZE``), else gloo."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"


def nccl_problem() -> str | None:
    """Why this rank cannot run on NCCL with GPU ``LOCAL_RANK``; None if it can."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_nccl_available():
        return f"this torch {torch.__version__} has no NCCL (a CPU build?)"
    if not torch.cuda.is_available():
        return "CUDA is not available (no GPU or no driver)"
    if torch.cuda.device_count() <= local_rank:
        return f"LOCAL_RANK {local_rank} needs a GPU of its own, there are {torch.cuda.device_count()}"
    return None


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    """``--backend``: gloo on the CPU or nccl with one GPU per rank (default:
    :func:`default_backend`), and ``--realtime-gloo`` (:func:`prioritize_gloo_threads`);
    :func:`start_backend` starts them."""
    parser.add_argument(
        "--backend",
        choices=["gloo", "nccl"],
        default=default_backend(),
        help="gloo on the CPU, or nccl with one GPU per rank (default here: %(default)s)",
    )
    parser.add_argument(
        "--realtime-gloo",
        action="store_true",
        help="run gloo's threads at real-time priority, so that compute never delays them "
        "(needs root or CAP_SYS_NICE; docs/benchmarks.md, \"Gloo's threads behind compute\")",
    )
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="have the C allocator keep the memory each step frees for the next, as the CUDA caching "
        "allocator does (glibc only; docs/benchmarks.md, \"Page faults in every step\")",
    )


def start_backend(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """:func:`init_backend` for ``args.backend``, after a usage error naming why NCCL cannot
    run here when it is nccl and it cannot; then, with ``args.realtime_gloo``,
    :func:`prioritize_gloo_threads` on the threads the group started (a usage error where
    it cannot), and with ``args.keep_freed_memory``, :func:`keep_freed_memory` first (a
    usage error where it cannot); the mesh's device."""
    if args.backend == "nccl" and (problem := nccl_problem()):
        parser.error(f"--backend nccl: {problem}; use --backend gloo")
    if args.realtime_gloo and args.backend != "gloo":
        parser.error("--realtime-gloo: only with --backend gloo")
    if args.keep_freed_memory:
        try:
            keep_freed_memory()
        except RuntimeError as error:
            parser.error(f"--keep-freed-memory: {error}")
    before = _threads()
    device = init_backend(args.backend)
    note_group_threads(before)
    if args.realtime_gloo:
        try:
            prioritize_gloo_threads(group_threads())
        except (PermissionError, RuntimeError) as error:
            parser.error(f"--realtime-gloo: {error}")
    return device


# the threads that start_backend's process group started in this process: {id: name}
_GROUP_THREADS: dict[int, str] = {}


def note_group_threads(before: dict[int, str]) -> None:
    """Note as the process group's threads (:func:`group_threads`) those of this process
    not in ``before`` (:func:`_threads` taken before the group started), once every rank's
    are running (after a barrier)."""
    dist.barrier()
    _GROUP_THREADS.update((tid, name) for tid, name in _threads().items() if tid not in before)


def group_threads() -> dict[int, str]:
    """The threads the process group started in this process (``{thread id: name}``:
    gloo's TCP event loop and ProcessGroupGloo's workers), as :func:`note_group_threads`
    (which :func:`start_backend` calls) found them; empty before."""
    return dict(_GROUP_THREADS)


def cpu_seconds(threads) -> float:
    """The seconds this process's ``threads`` (ids) have run on a core so far, by the
    kernel's scheduler statistics (nanoseconds; a thread that has ended counts 0)."""
    total = 0
    for tid in threads:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            continue
    return total / 1e9


GLOO_PRIORITY = 1  # SCHED_FIFO's lowest: above every ordinary thread


def _threads() -> dict[int, str]:
    """This process's threads: ``{thread id: name}``."""
    names = {}
    for tid in sorted(int(t) for t in os.listdir("/proc/self/task")):
        with open(f"/proc/self/task/{tid}/comm") as f:
            names[tid] = f.read().strip()
    return names


def realtime_threads() -> list[str]:
    """The names of this process's threads in ``SCHED_FIFO``, as the kernel reports them."""
    return [name for tid, name in _threads().items() if os.sched_getscheduler(tid) == os.SCHED_FIFO]


def prioritize_gloo_threads(started: dict[int, str]) -> None:
    """Put the threads the gloo group ``started`` (:func:`group_threads`: gloo's TCP event
    loop and ProcessGroupGloo's workers) in ``SCHED_FIFO`` at :data:`GLOO_PRIORITY`, so that one
    preempts compute as soon as it wakes (:func:`realtime_threads` reads them back).
    Every collective passes through these threads, and with two ranks on two cores the
    kernel's scheduler otherwise lets them wait behind compute: a collective after 0.2-1
    ms of compute then costs 0.14-0.45 ms more than back to back, and 0.04-0.15 ms more
    with them raised (docs/benchmarks.md, "Gloo's threads behind compute"). A diagnostic
    of the host, which NCCL's threads on a GPU machine do not share. All of them or none:
    with one left out, a collective ran slower than with none raised. Raises
    PermissionError without root or CAP_SYS_NICE, and RuntimeError when the group
    started no thread."""
    if not started:
        raise RuntimeError(f"the process group started no thread in this process (torch {torch.__version__})")
    for tid, name in started.items():
        try:
            os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(GLOO_PRIORITY))
        except PermissionError as error:
            raise PermissionError(f"cannot raise thread {tid} ({name}) to SCHED_FIFO: {error.strerror}; "
                                  "needs root or CAP_SYS_NICE") from error


# glibc's mallopt parameters (malloc.h) and its largest mmap threshold on 64-bit
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX = -1, -3, 32 * 2**20


def keep_freed_memory() -> None:
    """Have glibc's malloc keep what this process frees for its next allocations, as the
    CUDA caching allocator keeps a GPU's memory: blocks up to :data:`MMAP_THRESHOLD_MAX`
    come from the heap, and the heap is never trimmed. By default glibc hands the memory of
    large freed blocks back to the OS (the top of its heap above a trim threshold, and
    blocks above an mmap threshold), and a compiled CPU step that frees its buffers at the
    end faults them back in page by page in the next: a gpt-small step at world 2 ran 11%
    slower so (docs/benchmarks.md, "Page faults in every step"), a cost of the host's
    allocator that a GPU's step does not pay. Raises RuntimeError where the C library has
    no ``mallopt`` (not glibc) or refuses a setting."""
    libc = ctypes.CDLL(None)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        raise RuntimeError(f"the C library has no mallopt (glibc's), {platform.libc_ver()}")
    for name, option, value in (("M_MMAP_THRESHOLD", M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX), ("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD, 2**31 - 1)):
        if mallopt(option, value) != 1:
            raise RuntimeError(f"mallopt refused {name} = {value}")


def init_backend(backend: str) -> str:
    """Start the process group: NCCL on GPU ``LOCAL_RANK``, or gloo on the CPU; the mesh's device."""
    if backend == "gloo":
        dist.init_process_group("gloo")
        return "cpu"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    return "cuda"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma list of {list(ARMS)}")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    add_backend_argument(parser)
    args = parser.parse_args()
    mesh_device = start_backend(parser, args)
    world = dist.get_world_size()
    mesh = init_device_mesh(mesh_device, (world,))
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    for name in names:
        shapes = WORKLOADS[name]
        results = []
        for key in args.arms.split(","):
            result = measure(key, shapes, mesh, args.warmup, args.reps)
            results.append(result)
            small = [s for s in shapes if s[0] < world]
            if "error" in result and small:
                smaller = [s for s in shapes if s[0] >= world]
                again = measure(key, smaller, mesh, args.warmup, args.reps)
                again["arm"] += f" (without {len(small)} matrix < W rows)"
                results.append(again)
        if dist.get_rank() == 0:
            print(report(name, shapes, results, args.reps, args.warmup) + "\n", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

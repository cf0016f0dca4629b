"""Distributed benchmark of one Muon step on FSDP2 (DTensor ``Shard(0)``) parameters.

    torchrun --nproc-per-node 2 scripts/bench_distributed.py [--workload all] [--reps 7]
        [--backend gloo|nccl] [--tp N]

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

With ``--tp N`` the mesh is ``(W/N, N)``, named ``(dp, tp)``: the matrices alternate between
``ColwiseParallel`` and ``RowwiseParallel`` on ``tp`` (gpt-small-odd's qkv, out, up, down), then
``fully_shard`` on ``dp``, and the arms are the tensor-parallel ones (the default ``--arms``):

    tp-dtensor      muon_compile.Muon, backend="muon", each matrix left to DTensor's sharding
                    rule (the routing before tensor-parallel layouts were planned)
    muon-a2a        as above: tp_mode="distributed", by owner over the (dp, tp) group
    tp-duplicated   tp_mode="duplicated": every rank of the group orthogonalises every matrix
    tp-blockwise    tp_mode="blockwise": each TP block alone, by owner over dp

An arm that fails (unmodified torch.optim.Muon cannot update a matrix with fewer rows
than ranks) is reported with its error and measured again on the workload without such
matrices. Per arm: the median over ``--reps`` steps (after ``--warmup``) of the slowest
rank's step time (a barrier before each step, then the wall clock to the step's end; on
CUDA to the end of a ``torch.cuda.synchronize()`` after it, so queued GPU work counts), the
cold compile time (timed the same way), and from one profiled step on every rank (CPU-side
events): the backend's collectives per step (its ``gloo:``/``nccl:`` profiler events,
barriers excepted), bytes each rank sends per step (all_to_all: the rows it sends to other
ranks; all_gather: its input times W-1; all_reduce: 2(W-1)/W of its input;
reduce_scatter: (W-1)/W; "-" where a collective of another kind, or one recorded without
its inputs, such as ``nccl:coalesced``, makes the total unknown), and matmul FLOPs per rank
(``2 * batch * m * k * n`` of each ``aten::mm/bmm/addmm/baddbmm`` event's operands).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import statistics
import sys
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch._inductor.utils import fresh_cache

import muon_compile
from muon_compile import config, models
from muon_compile.ns.cost import ns_flops

from bench_common import (
    MATMUL_OPERANDS, Clock, Step, cell, error_summary, machine_info, non_negative_int, positive_int, time_steps,
)

KELLER = (3.4445, -4.7750, 2.0315)
LR, MOMENTUM, NS_STEPS = 0.02, 0.95, 5
Shape = tuple[int, int]

# models of the registry (muon_compile/models.py): gpt-small with uneven shards, and small widths
WORKLOADS: dict[str, list[Shape]] = {name: list(models.model(name).matrices) for name in ("gpt-small-odd", "small-14")}


# ---------------------------------------------------------------------------- devices
def rank_device() -> torch.device:
    """Where this rank's tensors live: its GPU under NCCL, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


class SlowestRankClock(Clock):
    """Times a call on every rank by the wall clock, from a barrier with this rank's device
    idle to the end of the device work the call queued; a time is the slowest rank's."""

    def __init__(self) -> None:
        self.device = rank_device()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def wall_s(self, fn: Step) -> float:
        self.synchronize()
        dist.barrier()
        seconds = torch.tensor(super().wall_s(fn), dtype=torch.float64, device=self.device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        return seconds.item()


# ------------------------------------------------------------------------- parameters
class Stack(nn.Module):
    def __init__(self, shapes: list[Shape]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(i, o, bias=False) for o, i in shapes)


def sharded_params(shapes: list[Shape], mesh) -> list[nn.Parameter]:
    """FSDP2-sharded weights with fixed values and gradients, the same on every run; on a
    ``(dp, tp)`` mesh, tensor-parallel first (column- and row-parallel in turn) and FSDP2 on ``dp``.

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
    if mesh.mesh_dim_names == ("dp", "tp"):
        plan = {f"layers.{i}": ColwiseParallel() if i % 2 == 0 else RowwiseParallel() for i in range(len(shapes))}
        parallelize_module(model, mesh["tp"], plan)
        mesh = mesh["dp"]
    fully_shard(model, mesh=mesh)
    params = [layer.weight for layer in model.layers]
    for p in params:
        grad = torch.randn(p.shape, generator=gen).to(device)
        p.grad = distribute_tensor(grad, p.device_mesh, p.placements, src_data_rank=None)  # every rank drew the same
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


def our_muon(params, tp_mode=None):
    return muon_compile.Muon(params, lr=LR, tp_mode=tp_mode).step


def dtensor_routed(params):
    """Our Muon with every matrix left to DTensor's sharding rule, as it was routed before
    tensor-parallel layouts joined the plan."""
    return our_muon(params)


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
    "tp-dtensor": ("muon, DTensor's rule per matrix", dtensor_routed, "muon", None),
    "tp-duplicated": ("muon tp duplicated", functools.partial(our_muon, tp_mode="duplicated"), "muon", None),
    "tp-blockwise": ("muon tp blockwise (not exact Muon)", functools.partial(our_muon, tp_mode="blockwise"), "muon", None),
}
TP_ARMS = "tp-dtensor,muon-a2a,tp-duplicated,tp-blockwise"


@contextlib.contextmanager
def dtensor_routing(key: str):
    """For the ``tp-dtensor`` arm: every DTensor's layout read as DTensor's own (while Dynamo
    traces, which is when the optimizer's op is chosen)."""
    if key != "tp-dtensor":
        yield
        return
    from unittest import mock

    from muon_compile.ns import op as ns_op
    from muon_compile.distributed import routing

    fallback = routing.Layout(routing.Kind.DTENSOR, reason="the tp-dtensor arm")
    with mock.patch.object(ns_op, "layout_of", lambda x, tp_mode=None: fallback if isinstance(x, DTensor) else routing.Layout(routing.Kind.LOCAL)):
        yield


# -------------------------------------------------------------------------- measuring
_ELEMENT = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8}
# the kind of a collective from its profiler event name after "<backend>:", lower case and
# without underscores: "_all_gather_base", "allgather", "all_gather_into_tensor_coalesced"
# are all all_gather ("all_reduce_barrier", a barrier, is dropped before)
_KINDS = {"alltoall": "all_to_all", "allgather": "all_gather", "reducescatter": "reduce_scatter", "allreduce": "all_reduce"}


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


def count_step(step, world: int, rank: int, clock: Clock) -> dict:
    """Collectives, bytes sent (NaN: unknown) and matmul FLOPs of one profiled step on this rank."""
    # the CPU-side events carry everything counted here, also under NCCL
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    clock.synchronize()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    prefix = f"{dist.get_backend()}:"  # the backend's own collective events: "gloo:..." or "nccl:..."
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


def measure(key: str, shapes: list[Shape], mesh, warmup: int, reps: int) -> dict:
    name, build, backend, strategy = ARMS[key]
    world, rank = dist.get_world_size(), dist.get_rank()
    clock = SlowestRankClock()
    result = {"arm": name}
    cache = fresh_cache() if backend else contextlib.nullcontext()
    strat = config.override(strategy=strategy) if strategy else contextlib.nullcontext()
    try:
        with cache, strat, dtensor_routing(key):
            torch._dynamo.reset()
            step = build(sharded_params(shapes, mesh))
            if backend:
                step = torch.compile(step, backend=backend)
                result["compile_s"] = clock.wall_s(step)
            result["times"] = time_steps(step, warmup, reps, clock)
            stats = count_step(step, world, rank, clock)
        values = [stats["collectives"], stats["sent"], stats["flops"]]
        totals = torch.tensor(values, dtype=torch.float64, device=rank_device())
        per_rank = [torch.zeros_like(totals) for _ in range(world)]
        dist.all_gather(per_rank, totals)
        result["collectives"] = int(max(t[0].item() for t in per_rank))
        result["sent_mb"] = [t[1].item() / 2**20 for t in per_rank]
        result["gflop"] = [t[2].item() / 1e9 for t in per_rank]
    except Exception as exc:  # report and go on: the table shows the failure
        result["error"] = error_summary(exc, limit=160)
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
    compile_s = cell(result.get("compile_s"), ".1f")
    sent = "/".join("-" if math.isnan(m) else f"{m:.3f}" for m in result["sent_mb"])
    flops = "/".join(f"{g:.2f}" for g in result["gflop"])
    return f"{result['arm']:<44} {median:9.2f} {min(result['times']) * 1e3:9.2f} {compile_s:>9} {result['collectives']:>6} {sent:>17} {flops:>17}"


def machine_text() -> str:
    """This rank's machine: the CPU model (so that runs on different machines tell apart),
    under NCCL the GPU and the CUDA version, torch, and the threads each rank computes on."""
    info = machine_info(rank_device())
    gpu = f", GPU {info['gpu']} x{torch.cuda.device_count()}, CUDA {info['cuda']}" if "gpu" in info else ""
    return f"{info['cpu']}, {info['cpu_count']} cpus{gpu}, torch {info['torch']}, {info['threads']} threads per rank"


def report(name: str, shapes: list[Shape], results: list[dict], reps: int, warmup: int, tp: int = 1) -> str:
    world = dist.get_world_size()
    expected = [2 * (world - 1) / world * local_bytes(shapes, world, r) / 2**20 for r in range(world)]
    ns = sum(ns_flops(r, c, NS_STEPS) for r, c in shapes) / 1e9
    layout = f"mesh (dp {world // tp}, tp {tp})" if tp > 1 else f"world {world}"
    lines = [
        f"=== {name}: {len(shapes)} fp32 matrices, {ns:.2f} GFLOP of NS per step, {layout} ({dist.get_backend()}) ===",
        f"machine: {machine_text()}; median of {reps} steps after {warmup} warm-up (slowest rank)",
        *([f"2(W-1)/W of each rank's local Muon-param bytes in bf16: {'/'.join(f'{m:.3f}' for m in expected)} MiB"] if tp == 1 else []),
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
    parser.add_argument("--arms", default=None, help=f"comma list of {list(ARMS)} (default: all but the tp- ones; with --tp, {TP_ARMS})")
    parser.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size: a (W/tp, tp) mesh (module docstring)")
    parser.add_argument("--reps", type=positive_int, default=7)
    parser.add_argument("--warmup", type=non_negative_int, default=2)
    parser.add_argument("--backend", choices=["gloo", "nccl"], default=default_backend(),
                        help="gloo on the CPU, or nccl with one GPU per rank (default here: %(default)s)")
    args = parser.parse_args()
    if args.arms is None:
        args.arms = TP_ARMS if args.tp > 1 else ",".join(k for k in ARMS if not k.startswith("tp-"))
    unknown = [key for key in args.arms.split(",") if key not in ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {unknown}; choose from {list(ARMS)}")
    if args.backend == "nccl" and (problem := nccl_problem()):
        parser.error(f"--backend nccl: {problem}; use --backend gloo")
    mesh_device = init_backend(args.backend)
    world = dist.get_world_size()
    if world % args.tp:
        parser.error(f"--tp {args.tp} does not divide the world size {world}")
    if args.tp > 1:
        mesh = init_device_mesh(mesh_device, (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    else:
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
            print(report(name, shapes, results, args.reps, args.warmup, args.tp) + "\n", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

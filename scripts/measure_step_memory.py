"""The compiled step's peak memory per rank, beside the cost model's bucket-buffer estimate.

    torchrun --nproc-per-node W scripts/measure_step_memory.py
        [--workload gpt-small] [--bucket-mb 64,4] [--reps 5] [--backend gloo|nccl]

For each bucket size, strategy and prefetch depth (0, 1), the step of
scripts/bench_distributed.py's arm is compiled and warmed up, then each of ``--reps``
steps is measured by :func:`peak_growth`: how far the rank's allocated memory rose above
its level before the step. The busiest rank's median is printed beside
:func:`muon_compile.step_cost.buffer_bytes` of the same plan, the planner's memory
estimate, and their ratio.

Under NCCL it is ``torch.cuda.max_memory_allocated`` less the memory allocated before.
On the CPU it is the process's resident set, made to follow what is allocated by
:func:`follow_allocations`: its peak (``VmHWM``, reset through ``/proc/self/clear_refs``)
less its size before the step. Two measures that look closer are not: the resident set
without glibc's help keeps freed memory and leaves out what is allocated but not yet
written (the output of a concatenation one of whose parts is computed first, which a GPU
holds from its allocation); the profiler's allocation events miss frees made on gloo's
threads (a send buffer released there stays counted to the end of the step).
A growth read from the resident set may fall short of the bytes allocated by up to
``RESIDENT_SET_SHORTFALL`` (2 MiB, printed in the header).
"""

from __future__ import annotations

import argparse
import ctypes
import math
import statistics

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from bench_distributed import ARMS, WORKLOADS, add_backend_argument, on_gpu, sharded_params, start_backend
from measure_profiles import STRATEGY_ARMS

from muon_compile import config
from muon_compile.plan import plan_for
from muon_compile.step_cost import buffer_bytes

_M_MMAP_THRESHOLD, _M_PERTURB = -3, -6  # glibc's mallopt parameters (malloc.h)


def follow_allocations() -> None:
    """Make this process's resident set follow its allocations of 64 KiB and more.

    glibc serves an allocation above its mmap threshold from a mapping of its own,
    unmapped when freed; below it, from the heap, which keeps freed memory resident. It
    raises the threshold (up to 32 MiB) as mapped blocks are freed: fixing it at 64 KiB
    stops that. A page is resident once written: glibc's perturb byte has every
    allocation filled when it is made, so it is resident from then. Tensors under 64 KiB
    are not seen: use workloads whose buckets hold megabytes."""
    libc = ctypes.CDLL(None)
    if not (libc.mallopt(_M_MMAP_THRESHOLD, 64 * 1024) and libc.mallopt(_M_PERTURB, 0x55)):
        raise RuntimeError("mallopt refused M_MMAP_THRESHOLD or M_PERTURB: the CPU measurement needs glibc")


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


# How far a growth read from the resident set may fall short of the bytes allocated. The
# kernel raises the peak (VmHWM) from per-CPU page counters it does not sum, each CPU up to
# max(32, 2 x CPUs) pages behind (0.25 MiB on 2 CPUs), while VmRSS sums them; and the
# resident set counts pages of mapped files (the libraries' code), which the kernel may
# drop during the call. A CI run of the unit test read 31.75 MiB for 33 MiB allocated.
RESIDENT_SET_SHORTFALL = 2 * 2**20


def peak_growth(fn, gpu: bool) -> int:
    """Bytes by which this process's memory peaked above its level before ``fn()``: the
    CUDA caching allocator's allocated bytes where ``gpu``, else the resident set, which
    follows the allocations once :func:`follow_allocations` has run (see the module
    docstring)."""
    if gpu:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    before = _status_bytes("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident set starts again from the current one
    fn()
    return _status_bytes("VmHWM") - before


def measure(name: str, bucket_mb: float, prefetch: int, strategy, reps: int, mesh) -> tuple[list[int], int]:
    """Every rank's median :func:`peak_growth` over ``reps`` compiled steps (after two warm-up
    steps), and the :func:`~muon_compile.step_cost.buffer_bytes` of the same plan."""
    shapes = WORKLOADS[name]
    _, build, backend, strategy_name = ARMS[STRATEGY_ARMS[strategy]]
    with config.override(strategy=strategy_name, bucket_mb=bucket_mb, prefetch=prefetch):
        step = torch.compile(build(sharded_params(shapes, mesh)), backend=backend, dynamic=False)
        for _ in range(3):  # the first call compiles
            step()
        own = statistics.median(peak_growth(step, on_gpu()) for _ in range(reps))
    torch._dynamo.reset()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, own)
    return every, buffer_bytes(plan_for(shapes, dist.get_world_size(), strategy, bucket_mb), prefetch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=list(WORKLOADS), default="gpt-small")
    parser.add_argument("--bucket-mb", default="64,4", help="comma list (default %(default)s)")
    parser.add_argument("--reps", type=int, default=5)
    add_backend_argument(parser)
    args = parser.parse_args()
    if args.backend == "gloo":
        follow_allocations()
    device = start_backend(parser, args)
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    log = print if dist.get_rank() == 0 else (lambda *_: None)
    log(f"# {args.workload}, world {dist.get_world_size()}, {args.backend}, torch {torch.__version__}, median of {args.reps} steps"
        + ("" if on_gpu() else f", resident-set peaks may read up to {RESIDENT_SET_SHORTFALL / 2**20:g} MiB short"))
    log(f"{'bucket MiB':>10} {'strategy':<10} {'prefetch':>8} {'peak MiB':>9} {'estimate MiB':>12} {'ratio':>6}  per rank")
    for mb in (float(x) for x in args.bucket_mb.split(",")):
        for strategy in STRATEGY_ARMS:
            for prefetch in (0, 1):
                every, estimate = measure(args.workload, mb, prefetch, strategy, args.reps, mesh)
                peak = max(every)
                ratio = peak / estimate if estimate else math.nan
                log(f"{mb:>10g} {strategy.value:<10} {prefetch:>8} {peak / 2**20:>9.2f} {estimate / 2**20:>12.2f} "
                    f"{ratio:>6.2f}  {', '.join(f'{b / 2**20:.2f}' for b in every)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

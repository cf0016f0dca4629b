"""Run a function on W real gloo processes on 127.0.0.1, or in one process under the
fake process group, bounded by a timeout.

``run_world(fn, world, *args)`` starts ``world`` processes (forked from a server that
has imported torch and the package once: :data:`_PRELOAD`), each calling
``fn(rank, world, *args)`` inside an initialised gloo process group, and returns the
list of their return values (rank order). ``run_fake(fn, world, ranks, *args)`` does the
same for the listed ranks only, each alone in its process under the fake process group
(``torch.testing._internal.distributed.fake_pg``): it traces any world size without
peers. A hang or a crash fails the call: the processes are killed after ``timeout``.
``fake_rank(fn, world, rank, *args)`` runs one fake rank in this process (no spawn: the
fast tier's golden graphs), with the process group torn down afterwards.

The spawned ranks compile into the Inductor cache directory of the test process
(:func:`shared_cache_dir`, the one the in-process tests use) with Inductor's FX graph
cache and the AOTAutograd cache off, as ``conftest.py`` runs the in-process tests: every
compile runs the passes, so the counters are exact, while a C++ kernel compiled once, by
a rank or in process, in this session or an earlier one, is not compiled again (the
kernel cache is keyed by the kernel's source and build command). A call that names its
own ``cache_dir`` gets the graph caches on.
"""

from __future__ import annotations

import contextlib
import io
import os
import traceback

import torch
import torch._functorch.config
import torch._inductor.config
from torch._inductor.runtime import cache_dir_utils

import torch.distributed as dist
import torch.multiprocessing as mp


def _store_server() -> dist.TCPStore:
    """The rendezvous of one world: a key-value store served by this process on a port the
    system picks and this process holds until the world ends, so that no two worlds (two
    pytest workers, or another program on the machine) can be given the same port, as a port
    found free and released before the ranks bind it could be."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _to_bytes(value) -> bytes:
    """Serialise a result: tensors put on a queue directly are shared through the sending
    process's file descriptors, which vanish when it exits."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def shared_cache_dir() -> str:
    """This process's Inductor cache directory (``TORCHINDUCTOR_CACHE_DIR``, or Inductor's
    default), which the spawned ranks share with it."""
    return cache_dir_utils.cache_dir()


def _worker(rank, world, port, fn, args, queue, cache_dir, graph_caches):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    # torch read its environment when this process imported it: set the configs themselves
    torch._inductor.config.fx_graph_cache = graph_caches
    torch._functorch.config.enable_autograd_cache = graph_caches
    try:
        if port is None:
            queue.put((rank, "ok", _to_bytes(fake_rank(fn, world, rank, *args))))
        else:
            store = dist.TCPStore("127.0.0.1", port, is_master=False)  # the parent's (_store_server)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
            try:
                queue.put((rank, "ok", _to_bytes(fn(rank, world, *args))))
            finally:
                dist.destroy_process_group()
    except BaseException:  # report any failure to the parent, which raises it
        queue.put((rank, "error", traceback.format_exc()))


# Whether the running test is marked ``distributed`` (tests/conftest.py sets it for each test;
# None outside pytest): CI selects the tests that run real ranks by that marker.
in_distributed_test: bool | None = None


def run_world(fn, world: int, *args, timeout: float = 600, cache_dir: str | None = None) -> list:
    """``[fn(0, world, *args), ..., fn(world - 1, world, *args)]``, each on its own gloo rank.

    ``cache_dir`` sets TORCHINDUCTOR_CACHE_DIR for every rank, with the graph caches on
    (default: :func:`shared_cache_dir`, the graph caches off). The process group has gloo's
    default timeout.
    """
    if in_distributed_test is False:
        raise RuntimeError("a test that runs gloo ranks must be marked @pytest.mark.distributed (CI selects them by it)")
    return _spawn(fn, world, list(range(world)), args, timeout, cache_dir, fake=False)


@contextlib.contextmanager
def _fake_group(world: int, rank: int):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def fake_rank(fn, world: int, rank: int, *args):
    """``fn(rank, world, *args)`` in this process under the fake process group."""
    with _fake_group(world, rank):
        return fn(rank, world, *args)


def run_fake(fn, world: int, ranks, *args, timeout: float = 600) -> list:
    """``[fn(r, world, *args) for r in ranks]``, each rank alone under the fake process group."""
    return _spawn(fn, world, list(ranks), args, timeout, None, fake=True)


# What every rank imports before it runs anything. The ranks are forked from a server
# process that has imported these once, instead of spawned fresh, each importing torch
# again (2-3 s of CPU a rank on the VM; the 15 gloo tests of test_distributed went from
# 294.7 s to 246.9 s, the eight world-8 fake ranks from 39-46 s to 23-32). The server does
# nothing but import, as a DataLoader's forked workers start from a process with torch
# imported; its environment is this process's when it started, and no test changes its
# environment for the ranks.
# The backend and what a rank's first FSDP2 compile imports of Inductor and torch.distributed
# come too (none asks for CUDA): imported lazily, they took 1.7-2.4 s of each rank's first
# step (an FSDP2 step of 4 matrices at world 2, its kernels on disk: 8.6-9.3 s, 6.2-7.2 s
# preloaded; the same step again 3.4-4.2 s).
# Not the test modules: tests/support/helpers.py asks torch.cuda.is_available() on import, which
# must not run in a process that forks (a forked rank could not initialise CUDA).
_PRELOAD = [
    "torch", "torch.distributed", "torch._dynamo", "muon_compile", "muon_compile.compile.backend",
    "torch._inductor.compile_fx", "torch._inductor.graph", "torch._inductor.lowering", "torch._inductor.scheduler",
    "torch._inductor.codegen.cpp", "torch._inductor.fx_passes.joint_graph", "torch._inductor.fx_passes.post_grad",
    "torch.distributed.fsdp", "torch.distributed.tensor.parallel",
    "rank_preload",  # Inductor's CPU vector ISA, chosen once for every rank (its docstring)
]


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    _start_forkserver()
    return ctx


def _start_forkserver():
    """Start this process's forkserver (once) with this folder on its ``PYTHONPATH``: Python
    3.11's forkserver is handed the parent's ``sys.path`` but does not apply it, so a preload
    from this folder (``rank_preload``) would fail to import, silently."""
    from multiprocessing import forkserver

    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.abspath(__file__)), before]))
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def _spawn(fn, world, ranks, args, timeout, cache_dir, fake):
    ctx = _context()
    queue = ctx.Queue()
    server = None if fake else _store_server()
    port = None if fake else server.port
    worker_args = (cache_dir or shared_cache_dir(), cache_dir is not None)
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, queue, *worker_args), daemon=True) for r in ranks]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    errors = []
    try:
        for _ in ranks:
            rank, status, value = queue.get(timeout=timeout)
            if status == "error":
                errors.append(f"rank {rank}:\n{value}")
                break
            results[rank] = torch.load(io.BytesIO(value), weights_only=False)
    except Exception as e:  # queue.Empty on timeout
        errors.append(f"timed out after {timeout} s waiting for ranks {sorted(set(ranks) - set(results))}: {e!r}")
    finally:
        for p in procs:
            p.join(timeout=5 if errors else 60)
            if p.is_alive():
                p.kill()
        del server  # the port is released once every rank has ended
    if errors:
        raise RuntimeError("\n".join(errors))
    return [results[r] for r in ranks]

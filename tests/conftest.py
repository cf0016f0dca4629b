"""Test-wide settings: a clean Dynamo state and exact pass counters for every test.

Every test runs with Inductor's FX graph cache and the AOTAutograd cache switched off, so
each compile runs the passes and the decision counters (``muon_compile.counters``) hold
exactly what that compile decided: no assertion needs to accept "0 on a cache hit".
Compiled C++ kernels are still reused (Inductor's cache directory). A test about those caches
themselves is marked ``graph_cache`` and runs inside its own fresh cache directory
(``torch._inductor.utils.fresh_cache``) with the caches on.

Markers: ``slow`` for multi-process tests and long compiles (``pytest -m "not slow"`` is
the one-minute tier), ``distributed`` for those that run real gloo ranks (``run_world``
refuses a test without it), ``graph_cache`` as above, ``cuda`` on every test instance that runs
on the GPU (``pytest -m cuda`` runs those only; scripts/gpu_check.sh does).

Order: the ``slow`` tests run first, so that in two workers (``scripts/test.sh``:
pytest-xdist's ``worksteal`` scheduling) the suite ends on short tests that the idle worker
can take over, not on a long one that it must wait for; among them, those marked with the
seconds they take (``slow(seconds=N)``, the longest few) run longest first, then the rest,
each group in its collected order.

Devices: a test that compiles or runs the op takes the ``device`` fixture and runs once
per available device: ``"cpu"`` always, ``"cuda"`` when ``torch.cuda.is_available()``.

Environment: every ``MUON_COMPILE_*`` variable and ``TRITON_INTERPRET`` are removed
before anything is imported (a test sets what it needs), but ``MUON_COMPILE_CPU_RATES=cpu``
(the reference CPU profile on every machine), and every process runs two threads
(``OMP_NUM_THREADS``, ``torch.set_num_threads``), as on CI's 2-core machine; the header of the
run says what was removed.

CPU vector ISA: ``TORCHINDUCTOR_VEC_ISA_OK=1`` (unless set otherwise), set before torch is
imported, so that its processes inherit it too. Without it, every process that compiles first
checks each ISA the CPU's flags name by building a test kernel and loading it in a child
interpreter; on torch 2.11 the child imports torch, about 3 s for each of 6 ISAs, 20 s per
pytest worker and per compiling subprocess. With it, Inductor trusts the CPU's flags for the
base ISAs: the same ISAs on this machine, and a compiler that could not build one fails the
test loudly. Its avx512_bf16, VNNI and AMX checks ignore the variable and still load their
kernels in child interpreters, once a process: the gloo ranks inherit that choice from their
forkserver (``rank_preload.py``).
"""

import os

os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

# The machine's settings of the package (every MUON_COMPILE_* variable: muon_compile.config's,
# and the scripts' own, which nothing in the test process reads) and Triton's interpreter switch
# would change what the tests compile: removed, and named in the header. Tests set what they
# need (config.override; helpers.run_interpreted for the interpreter).
CLEARED = {
    name: os.environ.pop(name) for name in list(os.environ) if name.startswith("MUON_COMPILE_") or name == "TRITON_INTERPRET"
}
# The CPU's matmul rates, which the plan's choices read, are the reference profile's on every
# machine (the CI VMs differ: one without AVX-512 forms bf16 products 100x slower and has a profile
# of its own), so a test plans alike everywhere; its processes inherit the setting. A test of
# another profile names it (config.override(cpu_rates=...)).
os.environ["MUON_COMPILE_CPU_RATES"] = "cpu"

# Two threads a process, whatever the machine: Inductor's CPU code depends on the thread count
# (how a loop or a reduction is split), so the programs compiled here are those compiled in CI
# on its 2-core machine, where the suite's bit-for-bit comparisons were checked.
THREADS = 2
os.environ["OMP_NUM_THREADS"] = str(THREADS)

import pytest  # noqa: E402
import torch

import muon_compile

import dist_harness
from helpers import DEVICES, graph_caches_off

torch.set_num_threads(THREADS)


def pytest_report_header(config):
    cleared = ", ".join(f"{name}={value}" for name, value in CLEARED.items())
    return [f"muon_compile tests: {THREADS} threads a process; removed from the environment: {cleared or 'nothing'}"]


def pytest_collection_modifyitems(config, items):
    """The ``slow`` tests first, longest first where marked with their seconds (see the
    module docstring); a stable sort keeps the order within each group, the same on every
    worker."""

    def key(item):
        slow = item.get_closest_marker("slow")
        return (slow is None, -(slow.kwargs.get("seconds", 0) if slow else 0))

    items.sort(key=key)


@pytest.fixture(params=[pytest.param(d, id=d, marks=pytest.mark.cuda if d == "cuda" else ()) for d in DEVICES])
def device(request):
    """Each available device in turn (see the module docstring)."""
    return request.param


@pytest.fixture(autouse=True)
def _fresh_dynamo_and_exact_counters(request):
    """Each test compiles from a clean Dynamo state and counts its own pass decisions."""
    torch._dynamo.reset()
    muon_compile.counters.clear()
    dist_harness.in_distributed_test = request.node.get_closest_marker("distributed") is not None
    if request.node.get_closest_marker("graph_cache"):
        yield
    else:
        with graph_caches_off():
            yield
    torch._dynamo.reset()

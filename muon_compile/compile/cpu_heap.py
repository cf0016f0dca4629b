"""The memory of a CPU step, kept between steps: glibc's malloc settings for this process.

A compiled step allocates its buffers afresh each call (Inductor's memory planning is within
a call). glibc returns a large freed block to the system (``munmap``, or trimming the top of
its heap past ``M_TRIM_THRESHOLD``), so the next step's first write into each page of it is a
page fault, the kernel's zeroing included. Measured (2026-12-07, this project's 2-core Intel
Xeon VM, torch 2.13.0, glibc 2.36, ``scripts/bench_cpu_heap.py``, docs/benchmarks.md):
``muon_compile.Muon`` under ``backend="muon"`` on gpt-small 86.75 ms a step with glibc's
settings (13,760 minor faults a step) against 70.31 ms with the settings below (none), on
many-small 15.78 ms (2,240) against 13.37; eagerly, gpt-small 128.66 ms (31,411) against
101.39, many-small 25.95 against 24.38.

When the backend compiles a graph that runs on the CPU, and at the Newton–Schulz op's first
eager call on the CPU, :func:`keep` sets, once per process,
``M_MMAP_THRESHOLD`` to 32 MiB (glibc's largest: blocks up to it come from the heap, where a
freed block stays for the next allocation) and ``M_TRIM_THRESHOLD`` to
``MUON_COMPILE_CPU_HEAP_MB`` (default 256; the free memory the top of the heap keeps; 64 MiB
already removed every fault on gpt-small). The process then keeps up to that much freed
memory instead of returning it, as jemalloc and tcmalloc do; blocks over 32 MiB are still
mapped and unmapped per call. ``MUON_COMPILE_CPU_HEAP_MB=0`` leaves glibc's settings as they
are. Without glibc (musl, macOS, Windows) nothing is set. The settings are the process's: they
replace a user's own ``mallopt`` or ``GLIBC_TUNABLES`` settings of the two (set the variable to 0
to keep those).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from collections.abc import Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MIB = 32  # glibc's largest M_MMAP_THRESHOLD on 64-bit systems (HEAP_MAX_SIZE / 2)

_MIB = 1 << 20
_kept_mib = 0  # the trim threshold this module set, MiB (0: none set)


def _glibc() -> ctypes.CDLL | None:
    """The process's C library where it is glibc (it has ``mallopt`` and ``gnu_get_libc_version``)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 (an AttributeError off glibc)
        return libc if hasattr(libc, "mallopt") else None
    except (OSError, AttributeError):
        return None


def keep(mib: int) -> int:
    """Make this process's heap keep up to ``mib`` MiB of freed memory (module docstring),
    unless it already keeps as much; return what it keeps (MiB; 0 where nothing is set:
    ``mib`` 0 or no glibc)."""
    global _kept_mib
    if mib <= _kept_mib:
        return _kept_mib
    libc = _glibc()
    if libc is None:
        return 0
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    trim = min(mib * _MIB, 2**31 - 1)  # mallopt takes an int
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MIB * _MIB) != 1 or mallopt(M_TRIM_THRESHOLD, trim) != 1:
        log.warning("muon_compile: glibc refused the CPU heap settings (mallopt); CPU steps keep glibc's defaults")
        return _kept_mib
    _kept_mib = trim // _MIB
    log.info(
        "muon_compile: this process's heap keeps up to %d MiB of freed memory for the next CPU step "
        "(M_TRIM_THRESHOLD; M_MMAP_THRESHOLD %d MiB; MUON_COMPILE_CPU_HEAP_MB=0 leaves glibc's settings)",
        _kept_mib,
        MMAP_THRESHOLD_MIB,
    )
    return _kept_mib


def kept_mib() -> int:
    """The freed memory this process's heap keeps by :func:`keep`, MiB (0: glibc's settings)."""
    return _kept_mib


def runs_on_cpu(example_inputs: Sequence[Any]) -> bool:
    """Whether a graph with these example inputs runs on the CPU: a CPU tensor of more than
    one element among them (0-D hyper-parameters stay on the CPU in a CUDA step too)."""
    return any(isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel() > 1 for t in example_inputs)

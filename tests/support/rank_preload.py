"""Imported by the forkserver that ``dist_harness`` forks every rank from (its last preload):
Inductor's choice of CPU vector ISA, made once there and inherited by every rank.

Inductor decides it at a process's first C++ compile, and only the base check honours
``TORCHINDUCTOR_VEC_ISA_OK``: the avx512_bf16, VNNI, AMX and AMX-fp16 checks each build a test
kernel and load it in a child interpreter that imports torch. A rank forked after the choice
finds it in the ``functools.cache`` of ``pick_vec_isa``; one that made it itself spent 0.7 s
on it on torch 2.13 and 8-15 s on 2.11's CUDA build (a world of 4 ranks, 4x that), about a
third of the cold gloo tests' time on 2.11.
"""

from torch._inductor import cpu_vec_isa

cpu_vec_isa.pick_vec_isa()

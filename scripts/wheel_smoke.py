"""Smoke test of an installed wheel (run by .ci/run from outside the repository).

Checks that ``muon_compile.passes`` is the copy inside the installed package, not a
folder of a source tree, and that one compiled step through the ``muon`` entry point
buckets the matrices and matches the eager step. The FX graph and AOTAutograd caches are
turned off: a cache hit (an earlier run of this script on the machine) skips the passes, and
their counters would read 0.
"""

import sys
from pathlib import Path

import torch

import muon_compile
import muon_compile.passes


def main() -> int:
    package = Path(muon_compile.__file__).resolve().parent
    passes = Path(muon_compile.passes.__file__).resolve().parent
    if passes != package / "passes":
        print(f"muon_compile.passes comes from {passes}, not from the installed package {package}")
        return 1
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    shapes = [(16, 8), (8, 16), (8, 8), (8, 8)]
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(s, generator=g) for s in shapes]
    grads = [torch.randn(s, generator=g) for s in shapes]
    runs = []
    for compiled in (False, True):
        params = [torch.nn.Parameter(w.clone()) for w in weights]
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        opt = muon_compile.Muon(params, lr=0.05, ns_dtype=torch.float32)
        (torch.compile(opt.step, backend="muon") if compiled else opt.step)()
        runs.append([p.detach() for p in params])
    for eager, comp in zip(*runs):
        torch.testing.assert_close(comp, eager, rtol=1e-4, atol=1e-5)
    buckets = muon_compile.counters["bucket.buckets"]
    if buckets != 2:  # 8x16 (with the tall 16x8) and 8x8
        print(f"expected 2 buckets, the passes made {buckets}")
        return 1
    print(f"wheel smoke ok: {package}, {buckets} buckets, compiled step equal to eager")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a compiled step launches, read off Inductor's generated code.

:func:`count_launches` takes the wrapper code of a compile (the strings
``torch._inductor.utils.run_and_get_code`` returns) and counts the calls its ``call``
function makes, by kind:

* ``products``: matrix products, ``extern_kernels.{mm,bmm,addmm,baddbmm}`` calls (cuBLAS,
  or the CPU's BLAS) and Triton matmul templates (``triton_tem_*``);
* ``kernels``: the other kernels Inductor generated (C++ functions ``cpp_fused_*`` on the
  CPU, Triton ``*.run(...)`` launches on CUDA): pointwise work and reductions;
* ``ops``: calls into operators Inductor did not generate (``torch.ops.NS.OP.overload(``):
  this package's stack ops, collectives and their waits, any aten fallback, by name in
  ``op_names``.

So ``products + kernels + ops`` is what the host issues per step, and for each
Newton–Schulz call the products are the algorithm's (3 per textbook iteration) and the
kernels the few around them (:func:`muon_compile.ns.evaluate.orthogonalize`).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable

_PRODUCT = re.compile(r"^\s*(?:extern_kernels\.(?:mm|bmm|addmm|baddbmm)\(|triton_tem_\w*\.run\()")
_KERNEL = re.compile(r"^\s*(?:cpp_fused_\w*\(|\w+\.run\()")
_OP = re.compile(r"^\s*(?:\w+ = )?torch\.ops\.(\w+)\.(\w+)\.\w+\(")


@dataclasses.dataclass(frozen=True)
class Launches:
    """Calls of a compiled step's generated code, by kind (see the module docstring)."""

    products: int
    kernels: int
    ops: int
    op_names: tuple[tuple[str, int], ...] = ()

    @property
    def total(self) -> int:
        return self.products + self.kernels + self.ops

    def describe(self) -> str:
        named = ", ".join(f"{name} {n}" for name, n in self.op_names)
        return f"{self.products} products, {self.kernels} kernels, {self.ops} op calls" + (f" ({named})" if named else "")


def count_launches(code: str | Iterable[str]) -> Launches:
    """The :class:`Launches` of the ``call`` functions in ``code`` (one wrapper module's
    source, or several)."""
    modules = [code] if isinstance(code, str) else list(code)
    products = kernels = 0
    ops: Counter[str] = Counter()
    for module in modules:
        for line in _call_body(module):
            if _PRODUCT.match(line):
                products += 1
            elif _KERNEL.match(line):
                kernels += 1
            elif m := _OP.match(line):
                ops[f"{m.group(1)}.{m.group(2)}"] += 1
    return Launches(products, kernels, sum(ops.values()), tuple(sorted(ops.items())))


def _call_body(module: str) -> list[str]:
    """The lines of the ``def call(...)`` in a wrapper module (a function, or a method of
    its runner class): those indented deeper than the ``def``."""
    lines = module.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("def call("):
            indent = len(line) - len(line.lstrip())
            body = []
            for inner in lines[i + 1 :]:
                if inner.strip() and len(inner) - len(inner.lstrip()) <= indent:
                    break
                body.append(inner)
            return body
    return []

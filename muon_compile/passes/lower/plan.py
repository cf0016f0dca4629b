"""plan_algorithms: pick the Newton–Schulz evaluation of every NS op node. Plain data out.

Algorithm (:func:`plan_algorithms`, run on the graph ``lower`` is about to rewrite, so after
bucketing and distribution every node is one bucket or one owner's batch):

  1. For each NS op node, take the matrices it orthogonalises from its site
     (:func:`~.find.find_ns_sites`, the one reader of an NS node's shape):
     ``batch x rows x cols``, a sharded node's matrix with its global row count.
  2. :func:`muon_compile.ns.cost.choose` resolves the node's ``algorithm``: an explicit
     one is kept, ``auto`` follows ``MUON_COMPILE_NS_ALGORITHM`` and then the cost model
     of the node's device. The choice depends on the matrix shape, dtype and device only,
     so the eager op decides alike.
  3. :func:`muon_compile.ns.cost.choose_products` picks how its products are formed:
     in fp32 on the iteration dtype's values where the device's measured rates have fp32
     products the faster (fp16 on every CPU measured, bf16 on one without AVX-512); else its
     symmetric ones by ``bmm``, or by the Triton kernel of :mod:`muon_compile.kernels.sym`
     where the device's measured table has it faster at that size (none is measured yet:
     never chosen by ``auto``, never on the CPU) or ``MUON_COMPILE_SYM_PRODUCTS=on``.
  4. :func:`muon_compile.ns.cost.choose_orientation` picks how a textbook iteration on tall
     matrices lays out its iterates: transposed (wide), or in their own layout where the
     device's measured table has that faster (this project's CPU); the traced kernel makes
     the same choice from the same shape. Then
     :func:`muon_compile.ns.cost.choose_epilogue` picks where a textbook iteration applies
     its polynomial's scalars: in the products' epilogues (``baddbmm``) or in one pointwise
     kernel between plain products, the form the device's measured table has faster at
     that size (the polynomial on this project's CPU, whose ``baddbmm`` copies its input
     first; the epilogue where nothing was measured) or ``MUON_COMPILE_NS_EPILOGUE``.
  5. The plan records the choices, their reasons and both algorithms' FLOPs and predicted
     seconds; ``lower`` then traces each node's kernel with the chosen algorithm and products.
  6. A node whose matrices have a symbolic shape (Dynamo's dynamic shapes) gets no
     choice: it is left as the op, whose kernel chooses from the real shape at each call,
     as in eager.

Before / after: a bf16 bucket ``12 x 384x1536`` with ``algorithm="auto"`` becomes ``gram``
on CUDA (``8 m^2 n + 28 m^3`` instead of ``20 m^2 n + 10 m^3`` FLOPs per matrix, in fp16
at the bf16 rate) and ``textbook`` on this project's CPU (fp16 products ~100x slower).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from muon_compile.ns.args import GRAM, TEXTBOOK, NSArgs
from muon_compile.ns.cost import (
    BMM,
    EPILOGUE,
    SYMMETRIC,
    TRANSPOSED,
    WIDE,
    Choice,
    ProductChoice,
    choose,
    choose_epilogue,
    choose_orientation,
    choose_products,
)

from ..find import NSSite


# how describe() names a products choice other than plain bmm
_PRODUCTS = {SYMMETRIC: "symmetric products", WIDE: "products in fp32"}


@dataclasses.dataclass(frozen=True)
class NodeChoice:
    """The evaluation of one NS op node's ``batch`` matrices of ``rows x cols``."""

    node: str
    batch: int
    rows: int
    cols: int
    args: NSArgs
    choice: Choice
    products: ProductChoice = ProductChoice(BMM, "not chosen")
    epilogue: ProductChoice = ProductChoice(EPILOGUE, "not chosen")
    orientation: ProductChoice = ProductChoice(TRANSPOSED, "not chosen")

    @property
    def chosen_args(self) -> NSArgs:
        return dataclasses.replace(self.args, algorithm=self.choice.algorithm)

    def flops(self, algorithm: str) -> int:
        return self.batch * self.choice.flops[algorithm]


@dataclasses.dataclass(frozen=True)
class AlgorithmPlan:
    """The choice of each NS op node, and ``skipped``: ``(node, reason)`` of each node left
    as the op, whose own kernel then chooses at every call."""

    choices: tuple[NodeChoice, ...]
    skipped: tuple[tuple[str, str], ...] = ()

    def by_node(self) -> dict[str, NodeChoice]:
        return {c.node: c for c in self.choices}

    def flops(self, algorithm: str | None = None) -> int:
        """Total NS FLOPs with every node on ``algorithm``, or (None) on its chosen one."""
        return sum(c.flops(algorithm or c.choice.algorithm) for c in self.choices)

    def describe(self) -> str:
        """One line per node, then the totals."""
        lines = []
        for c in self.choices:
            ch = c.choice
            costs = ", ".join(f"{a} {c.flops(a) / 1e9:.3g} GFLOP {1e3 * c.batch * ch.seconds[a]:.3g} ms" for a in (TEXTBOOK, GRAM))
            products = "" if c.products.kind == BMM else f"; {_PRODUCTS[c.products.kind]} ({c.products.reason})"
            form = f"; scalars in the {c.epilogue.kind} ({c.epilogue.reason})" if ch.algorithm == TEXTBOOK else ""
            if ch.algorithm == TEXTBOOK and c.rows > c.cols:
                form += f"; {c.orientation.kind} layout ({c.orientation.reason})"
            lines.append(
                f"ns {c.node}: {c.batch} x {c.rows}x{c.cols} {c.args.compute_dtype}: {ch.algorithm} ({ch.reason}; {costs}){products}{form}"
            )
        lines += [f"ns {node}: left as the op ({reason})" for node, reason in self.skipped]
        if self.choices:
            lines.append(
                f"NS GFLOP per step: chosen {self.flops() / 1e9:.4g}, all textbook {self.flops(TEXTBOOK) / 1e9:.4g}"
            )
        return "\n".join(lines)


def plan_algorithms(
    nodes: list[fx.Node],
    sites: list[NSSite],
    *,
    policy: str,
    products: str = "auto",
    epilogue: str = "auto",
    orientation: str = "auto",
) -> AlgorithmPlan:
    """Choose the algorithm and products of each NS op node in ``nodes``, described by
    ``sites`` (:func:`~.find.find_ns_sites` of the graph ``lower`` rewrites; see the module
    docstring), under ``MUON_COMPILE_NS_ALGORITHM`` (``policy``),
    ``MUON_COMPILE_SYM_PRODUCTS`` (``products``), ``MUON_COMPILE_NS_EPILOGUE`` (``epilogue``) and
    ``MUON_COMPILE_NS_ORIENTATION`` (``orientation``)."""
    choices, skipped = [], []
    for node, site in zip(nodes, sites, strict=True):
        if site.symbolic:
            skipped.append((node.name, site.skip_reason))
            continue
        args = site.args
        device = torch.device(site.device).type
        choice = choose(site.rows, site.cols, args.steps, args.compute_dtype, device, args.algorithm, policy)
        kind = choose_products(site.rows, site.cols, choice.algorithm, args.compute_dtype, device, products)
        form = choose_epilogue(site.rows, site.cols, args.compute_dtype, device, epilogue)
        layout = choose_orientation(site.rows, site.cols, args.compute_dtype, device, orientation)
        choices.append(NodeChoice(node.name, site.batch, site.rows, site.cols, args, choice, kind, form, layout))
    return AlgorithmPlan(tuple(choices), tuple(skipped))

"""Loops of Gram products that ``canonicalize``'s walk never saw as a candidate, so that the
explanation names every near miss, whatever stopped the walk.

The walk (:mod:`.walk`) starts a candidate loop at a division by a norm; a loop whose
input comes another way (normalised by another norm the walk does not read as one, cast by
a custom rounding after the normalisation, not normalised at all) forms Gram products that
belong to no candidate, and would go unmentioned. This search needs no algebra: a *Gram
product* is a product of a tensor with its own transpose (one storage, the last two sizes
and strides swapped), and two Gram products are in one *loop* when the second depends on
the first, through values or through a storage written in place (``out=`` buffers). A
loop of two Gram products or more, none of them a candidate's or depending on one's start, is a near miss,
reported at its first Gram product with what the producers of its input show (the first
integer value, or norm, met going back).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from muon_compile.passes.fx_writes import flat_nodes, storage_of, written_args

from .nodes import example_value, node_kind
from .values import Chain

_PRODUCTS = {"matmul": (0, 1), "addmm": (1, 2)}  # node kind -> positions of the two factors
_NORMS = ("norm", "linalg_norm", "matrix_norm", "vector_norm", "svd", "svdvals", "linalg_svd", "linalg_svdvals")
_BACK = 64  # producers followed back from a loop's input


def unseen_loops(graph: fx.Graph, chains: Iterable[Chain]) -> list[tuple[fx.Node, str]]:
    """``(first Gram product, reason)`` of each loop of at least two Gram products none of
    which belongs to one of ``chains`` (see the module docstring)."""
    chains = list(chains)
    seen = {node for chain in chains for node in chain.members}
    seen |= _depending_on(graph, {chain.start for chain in chains})
    loops = _gram_loops(graph)
    return [(grams[0], _reason(grams[0])) for grams in loops if len(grams) >= 2 and not seen.intersection(grams)]


def _depending_on(graph: fx.Graph, starts: set[fx.Node]) -> set[fx.Node]:
    """The nodes of ``graph`` that depend on one of ``starts``, through values or through a
    storage written in place."""
    found: set[fx.Node] = set()
    storages: set[StorageWeakRef] = set()
    for node in graph.nodes:
        inputs = flat_nodes((node.args, node.kwargs))
        if node in starts or any(n in found or storage_of(n) in storages for n in inputs):
            found.add(node)
            storages.update(s for s in map(storage_of, [node, *written_args(node)]) if s is not None)
    return found


def gram_factor(node: fx.Node) -> fx.Node | None:
    """The first factor of ``node`` if it is a Gram product (a tensor times its own transpose)."""
    kind = node_kind(node)[0]
    if kind not in _PRODUCTS:
        return None
    i, j = _PRODUCTS[kind]
    if len(node.args) <= j:
        return None
    a, b = node.args[i], node.args[j]
    ta, tb = example_value(a), example_value(b)
    if not (isinstance(ta, torch.Tensor) and isinstance(tb, torch.Tensor)) or ta.dim() < 2 or tb.dim() < 2:
        return None
    try:
        same = StorageWeakRef(ta.untyped_storage()) == StorageWeakRef(tb.untyped_storage())
    except (NotImplementedError, RuntimeError):
        return None
    transposed = ta.shape[-2:] == tb.shape[-2:][::-1] and ta.stride()[-2:] == tb.stride()[-2:][::-1]
    return a if same and transposed and ta.storage_offset() == tb.storage_offset() else None


def _gram_loops(graph: fx.Graph) -> list[list[fx.Node]]:
    """The Gram products of ``graph`` grouped into loops (a loop: a product and those that
    depend on it), in graph order."""
    loop_of: dict[fx.Node, int] = {}  # node -> the loop it depends on
    storage_loop: dict[StorageWeakRef, int] = {}
    parent: list[int] = []
    grams: list[list[fx.Node]] = []

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for node in graph.nodes:
        inputs = flat_nodes((node.args, node.kwargs))
        found = {root(loop_of[n]) for n in inputs if n in loop_of}
        found |= {root(storage_loop[s]) for s in map(storage_of, inputs) if s in storage_loop}
        loop = min(found) if found else None
        for other in found:  # one loop depending on two: they are one
            parent[other] = loop
        if gram_factor(node) is not None:
            if loop is None:
                loop = len(parent)
                parent.append(loop)
                grams.append([])
            grams[loop].append(node)
        if loop is None:
            continue
        loop_of[node] = loop
        for target in [node, *written_args(node)]:
            storage = storage_of(target)
            if storage is not None:
                storage_loop[storage] = loop
    merged: dict[int, list[fx.Node]] = {}
    for i, nodes in enumerate(grams):
        merged.setdefault(root(i), []).extend(nodes)
    return list(merged.values())


def _reason(gram: fx.Node) -> str:
    """Why the walk saw no loop at ``gram``: what its input's producers show."""
    node = gram_factor(gram)
    for _ in range(_BACK):
        if not isinstance(node, fx.Node) or node.op == "placeholder":
            break
        value = example_value(node)
        name = node_kind(node)[0] or str(getattr(node.target, "__name__", node.target))
        if isinstance(value, torch.Tensor) and not value.dtype.is_floating_point:
            return (f"a loop of Gram products whose input passes through integer values ({name}, {value.dtype}) "
                    f"after its normalisation: a cast the walk cannot read (a custom rounding?)")
        if any(n in name for n in _NORMS):
            return f"a loop of Gram products whose input is not divided by its per-matrix Frobenius norm ({name})"
        tensors = [n for n in flat_nodes(node.args) if isinstance(example_value(n), torch.Tensor)]
        node = tensors[0] if tensors else None
    return "a loop of Gram products whose input is not divided by a norm of its own: the walk starts no loop there"

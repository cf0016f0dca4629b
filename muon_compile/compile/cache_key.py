"""What the compiled artifacts of the ``muon`` backend are keyed by, besides Inductor's own key.

The passes run inside Inductor as a ``CustomGraphPass``, whose ``uuid()`` enters the FX
graph and AOTAutograd cache keys. It must change whenever the passes could produce
another graph: when any source file of this package changes (:func:`package_sources`,
found from the package's own directories, so a new module is covered without a list to
keep; the cluster advisor and the models, :data:`NOT_COMPILED`, are left out), when the configuration
changes, and from one rank to another (:func:`rank_key`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch.distributed as dist
from torch._inductor.custom_graph_pass import get_hash_for_files
from torch.distributed.tensor import DTensor

# what nothing on the compile path imports (the cluster advisor, the registry of models): not in the key
NOT_COMPILED = ("advisor", "models.py")


def package_sources(package: ModuleType, leave_out: Sequence[str] = ()) -> tuple[str, ...]:
    """Every ``.py`` file under ``package``'s directories, subpackages included, except
    those under its subpackages or among its modules named in ``leave_out``; sorted."""
    dirs = [Path(d).resolve() for d in package.__path__]
    skipped = [d / name for d in dirs for name in leave_out]
    files = {f for d in dirs for f in d.rglob("*.py") if not any(f.is_relative_to(s) for s in skipped)}
    return tuple(sorted(str(f) for f in files))


def sources_hash(package: ModuleType) -> bytes:
    """A hash of the contents of :func:`package_sources`, :data:`NOT_COMPILED` left out
    (nothing on the compile path imports it); cached per set of files."""
    return get_hash_for_files(package_sources(package, NOT_COMPILED))


def rank_key(example_inputs: Sequence[Any]) -> tuple:
    """What makes this rank's compiled graph its own: the rank and the local shard shapes.

    The passes bake the rank into the graph (which matrices it orthogonalises, which rows
    it keeps), and torch 2.13 keys a DTensor's cache entry by its global spec only, so
    without this a shared cache directory hands one rank another rank's artifact.
    """
    shards = [tuple(t._local_tensor.shape) for t in example_inputs if isinstance(t, DTensor)]
    if not shards or not dist.is_initialized():
        return ()
    return (dist.get_rank(), tuple(shards))

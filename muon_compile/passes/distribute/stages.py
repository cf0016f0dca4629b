"""The vocabulary of a distributed bucket's stages, shared by ``distribute`` (which tags
each node it adds) and ``schedule`` (which orders the tagged nodes).

A bucket runs as *launch* (pack, first collective), *compute* (wait, Newton–Schulz,
return collective) and, for ``all_to_all``, *finish* (wait, unpack). Each node carries
its :class:`StageTag` in ``node.meta[STAGE_META]``.
"""

from __future__ import annotations

import dataclasses
import enum

import torch.fx as fx

STAGE_META = "muon_compile_stage"


class Stage(enum.Enum):
    LAUNCH = "launch"
    COMPUTE = "compute"
    FINISH = "finish"


@dataclasses.dataclass(frozen=True)
class StageTag:
    """The bucket (its index in the distribution plan) and stage a node belongs to."""

    bucket: int
    stage: Stage

    def __str__(self) -> str:
        return f"bucket {self.bucket} {self.stage.value}"


def stage_of(node: fx.Node) -> StageTag | None:
    """The tag ``distribute`` gave ``node``, or None."""
    return node.meta.get(STAGE_META)


def tagged(tag: StageTag | None) -> dict:
    """The ``node.meta`` entries that carry ``tag`` (none for None)."""
    return {} if tag is None else {STAGE_META: tag}

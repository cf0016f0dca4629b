"""One type for every mode a setting takes (an algorithm, a policy, a strategy): a
:class:`Mode` enum per setting, defined where the setting is owned, with its validator derived
from it. A mode's members are strings (their value), so a member and its spelling compare
equal; settings that reach a graph (an op's arguments) hold the plain value (:meth:`Mode.check`).
"""

from __future__ import annotations

import enum
from typing import TypeVar

M = TypeVar("M", bound="Mode")


class Mode(str, enum.Enum):
    """The values of one setting (``enum.StrEnum``'s behaviour, on Python 3.10 too)."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def values(cls) -> list[str]:
        return [m.value for m in cls]

    @classmethod
    def parse(cls: type[M], value: object, where: str) -> M:
        """``value`` (a member or its spelling) as a member; ``ValueError`` naming ``where`` and
        the values otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{where} must be one of {cls.values()}, got {value!r}") from None

    @classmethod
    def check(cls, value: object, where: str) -> str:
        """``value`` as the plain string of its member (:meth:`parse`'s error otherwise)."""
        return cls.parse(value, where).value

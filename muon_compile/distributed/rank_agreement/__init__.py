"""Rank agreement: before a step graph with collectives is compiled, the ranks of each
process group compare what they are about to run (:mod:`.fingerprint` says what,
:mod:`.exchange` compares it through the process group's store and raises
:class:`RankDivergenceError` on every rank at the first difference)."""

from .exchange import RankDivergenceError, agree, failing, first_difference, guard_collectives

__all__ = ["RankDivergenceError", "agree", "failing", "first_difference", "guard_collectives"]

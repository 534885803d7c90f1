"""Candidate lists that know their endpoints' rows in the arrays, and a filter's memo."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import compress

import numpy as np

from infera_core.scheduling import arrays as _arrays
from infera_core.scheduling.arrays import Mask, Rows, state
from infera_core.scheduling.types import Endpoint

_INF = float("inf")


class Candidates(list[Endpoint]):
    """A candidate list that knows its endpoints' rows (``rows[i]`` is ``self[i].row``)."""

    __slots__ = ("rows",)

    def __init__(self, endpoints: Sequence[Endpoint] = (), rows: Rows | None = None) -> None:
        super().__init__(endpoints)
        self.rows: Rows = rows if rows is not None else _rows(self)

    def subset(self, keep: Mask) -> Candidates:
        """The candidates where ``keep`` is true, in order (``self`` when all are)."""
        if keep.all():
            return self
        return Candidates(list(compress(self, keep.tolist())), self.rows[keep])


def _rows(endpoints: Sequence[Endpoint]) -> Rows:
    return np.fromiter((ep.row for ep in endpoints), np.int64, len(endpoints))


def rows_of(candidates: Sequence[Endpoint]) -> Rows:
    """The rows of ``candidates`` (free for :class:`Candidates`)."""
    if type(candidates) is Candidates:
        return candidates.rows
    return _rows(candidates)


class FilterMemo:
    """Remembers a filter's last result for the same input list, context key and generation.

    Candidate lists are never mutated in place (the endpoint table builds new ones on every
    change), so the same list object with the same ``generation`` gives the same result
    until ``valid_until`` (a clock time: a breaker's half-open probe falls due).
    """

    __slots__ = ("_gen", "_input", "_key", "_out", "_until")

    def __init__(self) -> None:
        self._input: object = None
        self._key: object = None
        self._gen = -1
        self._until = 0.0
        self._out: Candidates | None = None

    def get(
        self, candidates: list[Endpoint], key: object, clock: Callable[[], float] | None
    ) -> Candidates | None:
        if (
            candidates is not self._input
            or key is not self._key
            or _arrays._STATE is None
            or self._gen != _arrays._STATE.generation
        ):
            return None  # (no arrays yet: no endpoint either)
        until = self._until
        if until != _INF and (clock is None or clock() >= until):
            return None
        return self._out

    def put(
        self, candidates: list[Endpoint], key: object, out: list[Endpoint], until: float = float("inf")
    ) -> Candidates:
        result = out if type(out) is Candidates else Candidates(out)
        self._input = candidates
        self._key = key
        self._gen = state().generation
        self._until = until
        self._out = result
        return result

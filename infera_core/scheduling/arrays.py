"""The router's per-endpoint load state as arrays, so policies score a fleet without a Python loop.

Every :class:`~infera_core.scheduling.types.Endpoint` owns one *row* of the process-wide
:class:`EndpointArrays` (``ep.row``): its in-flight requests and prompt tokens, its
decayed recent dispatches and the engine's queue length live there, read and written
through the endpoint's attributes as before. A policy holding a list of candidates gets
their rows with :func:`rows_of` (free for a :class:`Candidates` list, which carries them)
and reads a column for all of them at once (``state().in_flight[rows]``).

``generation`` changes whenever what the cached filters read changes (a row is reused, a
record is replaced, a breaker opens or closes), so a filter may return the same list for
the same input until then (see :class:`FilterMemo`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import compress
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from infera_core.scheduling.shared_load import SharedLoad
    from infera_core.scheduling.types import Endpoint

Rows = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]

_INF = float("inf")

ARRAY_MIN = 48
"""Below this many candidates the per-endpoint Python path is faster than numpy's call overhead."""


class EndpointArrays:
    """Columns of per-endpoint state, one row per live endpoint; rows are reused after release."""

    __slots__ = (
        "_free",
        "fill",
        "generation",
        "in_flight",
        "load_slot",
        "prompt_tokens",
        "recent",
        "recent_ts",
        "recent_writes",
        "shared",
        "size",
        "waiting",
    )

    def __init__(self, capacity: int = 64) -> None:
        self.in_flight = np.zeros(capacity, np.int64)
        self.prompt_tokens = np.zeros(capacity, np.int64)
        self.recent = np.zeros(capacity, np.float64)
        self.recent_ts = np.zeros(capacity, np.float64)
        self.waiting = np.zeros(capacity, np.float64)
        self.fill = np.zeros(capacity, np.float64)
        """Prompt tokens sent to the worker that its cache did not hold (``cache-fill``, scaled)."""
        self.load_slot = np.full(capacity, -1, np.int64)
        """The endpoint's slot in :attr:`shared` (-1: none)."""
        self.shared: SharedLoad | None = None
        """Requests in flight counted with the sibling processes (``serve --processes N`` with
        ``--max-inflight-per-worker``); None: this process's own counts are the router's."""
        self.recent_writes = 0
        """Counts writes to ``recent``/``recent_ts`` (what is derived from them is cached)."""
        self.size = 0
        self._free: list[int] = []
        self.generation = 0

    def alloc(self) -> int:
        """A zeroed row for a new endpoint."""
        self.generation += 1
        if self._free:
            return self._free.pop()
        row = self.size
        if row == len(self.in_flight):
            n = 2 * row
            for name in ("in_flight", "prompt_tokens", "recent", "recent_ts", "waiting", "fill"):
                old = getattr(self, name)
                new = np.zeros(n, old.dtype)
                new[:row] = old
                setattr(self, name, new)
            slots = np.full(n, -1, np.int64)
            slots[:row] = self.load_slot
            self.load_slot = slots
        self.size = row + 1
        return row

    def release(self, row: int) -> None:
        self.in_flight[row] = 0
        self.prompt_tokens[row] = 0
        self.recent[row] = 0.0
        self.recent_ts[row] = 0.0
        self.waiting[row] = 0.0
        self.fill[row] = 0.0
        self.load_slot[row] = -1
        self.recent_writes += 1
        self._free.append(row)
        self.generation += 1

    def changed(self) -> None:
        """Something the filters read changed (record, breaker): cached filter results are stale."""
        self.generation += 1


_STATE: EndpointArrays | None = None


def state() -> EndpointArrays:
    """The process-wide arrays (created on first use)."""
    global _STATE
    if _STATE is None:
        _STATE = EndpointArrays()
    return _STATE


class Candidates(list["Endpoint"]):
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


def relative_inverse(values: Floats) -> Floats:
    """1 for the lowest, falling to 0 at the highest (all 1 when all are zero); array form."""
    top = float(values.max()) if len(values) else 0.0
    if top <= 0:
        return np.ones(len(values), np.float64)
    return 1.0 - values / top


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
            or _STATE is None
            or self._gen != _STATE.generation
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

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

import math
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Rows = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]

_INF = float("inf")

ARRAY_MIN = 48
"""Below this many candidates the per-endpoint Python path is faster than numpy's call overhead."""


class SharedCounts(Protocol):
    """The router-wide in-flight table that ``serve --processes N`` shares across processes
    (:class:`infera_core.scheduling.shared_load.SharedLoad`)."""

    q: memoryview
    processes: int
    index: int

    def in_flight_rows(self, arrays: EndpointArrays, rows: Rows) -> Rows: ...


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
        self.shared: SharedCounts | None = None
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


def relative_inverse(values: Floats) -> Floats:
    """1 for the lowest, falling to 0 at the highest (all 1 when all are zero); array form."""
    top = float(values.max()) if len(values) else 0.0
    if top <= 0:
        return np.ones(len(values), np.float64)
    return 1.0 - values / top


def py_predicted_ttft(
    overlap: Any, rate: Floats, wait: Floats | None, qerr: Floats | None, tokens: float, factor: float | None
) -> tuple[Floats, Floats, float]:
    """``predicted-latency``'s pass over its candidates, in numpy (the specification of
    :func:`predicted_ttft`): ``uncached = (1 − clip(overlap, 0, 1)) · tokens`` and ``ttft = uncached
    / rate`` (``+ wait``, ``+ qerr`` where ``wait > 0``; None: none), and ``min(ttft)``; with
    ``factor``, the second array is ``(ttft − min) · factor`` instead (in place)."""
    uncached = np.maximum(np.asarray(overlap, np.float64), 0.0)  # a new array: the caller's stays
    np.minimum(uncached, 1.0, out=uncached)
    np.subtract(1.0, uncached, out=uncached)
    uncached *= tokens
    ttft = uncached / rate
    if wait is not None:
        ttft += wait
        if qerr is not None:
            np.add(ttft, qerr, out=ttft, where=wait > 0)
    low = float(ttft.min()) if len(ttft) else math.inf
    if factor is not None:
        ttft -= low
        ttft *= factor
    return uncached, ttft, low


def py_weighted_sum(parts: Sequence[Floats], weights: Sequence[float], bounded: Sequence[bool]) -> Floats:
    """Σ clip(part, 0, 1) · weight, the parts added in order (numpy; the specification of
    :func:`weighted_sum`); a ``bounded`` part (within [0, 1] by construction) is not clipped."""
    total: Floats | None = None
    for part, w, b in zip(parts, weights, bounded, strict=True):
        term = (part if b else np.clip(part, 0.0, 1.0)) * w
        total = term if total is None else total + term
    assert total is not None
    return total


_NativeTtft = Callable[..., float]
_NativeSum = Callable[..., None]


def _native_kernel(name: str) -> Any:
    """``infera_kv_native``'s ``name`` loop, None when the extension (or that loop) is not built."""
    try:
        import infera_kv_native  # optional: built with a C compiler
    except ImportError:
        return None
    return getattr(infera_kv_native, name, None)


def _native_ttft() -> _NativeTtft | None:
    kernel: _NativeTtft | None = _native_kernel("predicted_ttft")
    return kernel


def _native_sum() -> _NativeSum | None:
    kernel: _NativeSum | None = _native_kernel("weighted_sum")
    return kernel


_native: _NativeTtft | None = None
_native_weighted: _NativeSum | None = None


def use_native_kernels(enabled: bool = True) -> bool:
    """Run :func:`predicted_ttft` and :func:`weighted_sum` in the ``infera-kv-native`` C
    extension when ``enabled`` and built (``INFERA_KV_NATIVE=0``: numpy); returns whether it does."""
    global _native, _native_weighted
    _native = _native_ttft() if enabled else None
    _native_weighted = _native_sum() if enabled else None
    return _native is not None


use_native_kernels(os.environ.get("INFERA_KV_NATIVE", "1") != "0")


def predicted_ttft(
    overlap: Any, rate: Floats, wait: Floats | None, qerr: Floats | None, tokens: float, factor: float | None
) -> tuple[Floats, Floats, float]:
    """:func:`py_predicted_ttft` in one C loop (two with ``factor``) when the extension is built:
    the same IEEE operations in the same order, so the same bits (tests check it), without some
    ten numpy passes and their temporaries."""
    native = _native
    n = len(rate)
    if native is None or n == 0:
        return py_predicted_ttft(overlap, rate, wait, qerr, tokens, factor)
    uncached, ttft = np.empty(n, np.float64), np.empty(n, np.float64)
    try:  # the C side takes contiguous float64 buffers only
        low = native(overlap, rate, wait, qerr, tokens, uncached, ttft, factor)
    except (TypeError, ValueError, BufferError):  # e.g. a list of overlaps (a scorer's list form)
        f64 = np.ascontiguousarray
        wait = None if wait is None else f64(wait, np.float64)
        qerr = None if qerr is None else f64(qerr, np.float64)
        rate, overlap = f64(rate, np.float64), f64(overlap, np.float64)
        low = native(overlap, rate, wait, qerr, tokens, uncached, ttft, factor)
    return uncached, ttft, low


def weighted_sum(parts: Sequence[Floats], weights: Sequence[float], bounded: Sequence[bool]) -> Floats:
    """:func:`py_weighted_sum` in one C pass per part, without numpy's temporaries (two to three
    arrays per scorer): the same IEEE operations in the same order, so the same bits."""
    native = _native_weighted
    n = len(parts[0]) if parts else 0
    if native is None or n == 0 or len(parts) > 64:
        return py_weighted_sum(parts, weights, bounded)
    clipped = sum(1 << k for k, b in enumerate(bounded) if not b)
    out = np.empty(n, np.float64)
    try:  # the C side takes contiguous float64 buffers only
        native(tuple(parts), tuple(weights), clipped, out)
    except (TypeError, ValueError, BufferError):  # e.g. a scorer's list, float32 or strided array
        f64 = np.ascontiguousarray
        native(tuple(f64(p, np.float64) for p in parts), tuple(map(float, weights)), clipped, out)
    return out

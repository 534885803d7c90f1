"""The prompts the router sent that a worker is computing or has just computed: ``kv-overlap``'s ``pending`` credit.

A worker computes a prompt's blocks once it admits the request, and its KV events report
them only after that. Until they are indexed, requests sharing the prefix see it nowhere
and are spread over the fleet, each computing it again: a burst of one group's requests,
any queue near capacity, or an event plane that lags (JetStream on a loaded host). The
router credits a prompt as cached on the worker it went to while the request is in
flight and for ``linger`` seconds after it ended well (its blocks stay in the engine's
prefix cache; the events are on the way). A request that failed stops counting at once.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable

from infera_core.request import RequestContext
from infera_core.scheduling.arrays import Floats, Rows
from infera_core.scheduling.types import Endpoint, KvIndexView

MAX_IN_FLIGHT = 100_000
"""Requests whose prompts :class:`InFlightPrefixes` remembers at most (in flight or lingering)."""

Key = tuple[str, str]


class InFlightPrefixes:
    """Per endpoint row, the prompts of requests in flight there or ended less than ``linger`` ago.

    Shared by every profile of a server (``SchedulerDeps.extra``).
    """

    __slots__ = ("_expiry", "clock", "ending", "last", "pending", "sent")

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock = clock or time.monotonic
        self.last: tuple[str, Rows | list[int], Floats | list[float]] | None = None
        """(request id, candidate rows, their overlap): the last request ``kv-overlap`` scored."""
        self.pending: dict[int, dict[int, dict[int, int]]] = {}
        """Block size → router hash → {endpoint row: requests there whose prompt has that block}."""
        self.sent: dict[Key, tuple[int, int, list[int]]] = {}
        """(request id, worker id) → (endpoint row, block size, the prompt's hashes counted in ``pending``)."""
        self.ending: dict[Key, float] = {}
        """Requests that ended well, still credited: key → when the credit ends."""
        self._expiry: deque[tuple[float, Key]] = deque()
        """(when, key) in end order; an entry whose key ended again later or was dropped is stale."""

    def add(self, ctx: RequestContext, endpoint: Endpoint, hashes: list[int], bs: int) -> None:
        key = (ctx.request_id, endpoint.worker_id)
        if not hashes:
            return
        self.expire()  # (also here: a fleet of one worker is never scored)
        if key in self.sent:
            if key not in self.ending:
                return  # already counted (another profile of the same request)
            self._drop(key)  # the same request id sent again while its last credit lingers
        row = endpoint.row
        pending = self.pending.setdefault(bs, {})
        marks = [hashes[k] for k in checkpoints(len(hashes))]
        for h in marks:
            held = pending.get(h)
            if held is None:
                pending[h] = {row: 1}
            else:
                held[row] = held.get(row, 0) + 1
        self.sent[key] = (row, bs, marks)
        if len(self.sent) > MAX_IN_FLIGHT:  # a request whose end was never reported: forget the oldest
            self._drop(next(iter(self.sent)))

    def remove(self, ctx: RequestContext, endpoint: Endpoint, ok: bool = False, linger: float = 0.0) -> None:
        """The request ended: stop crediting its prompt now, or ``linger`` seconds from now if ``ok``."""
        key = (ctx.request_id, endpoint.worker_id)
        if key not in self.sent:
            return
        if ok and linger > 0:
            until = self.clock() + linger
            self.ending[key] = until
            self._expiry.append((until, key))
        else:
            self._drop(key)

    def expire(self) -> None:
        """Drop the credits whose linger ran out."""
        expiry = self._expiry
        if not expiry:
            return
        now = self.clock()
        ending = self.ending
        while expiry and expiry[0][0] <= now:
            until, key = expiry.popleft()
            if ending.get(key) == until:
                self._drop(key)

    def _drop(self, key: Key) -> None:
        self.ending.pop(key, None)
        sent = self.sent.pop(key, None)
        if sent is None:
            return
        row, bs, hashes = sent
        pending = self.pending.get(bs)
        if pending is None:
            return
        for h in hashes:
            held = pending.get(h)
            if held is None:
                continue
            c = held.get(row, 0) - 1
            if c > 0:
                held[row] = c
            else:
                held.pop(row, None)
                if not held:
                    del pending[h]
        if not pending:
            del self.pending[bs]

    def depth(self, ctx: RequestContext, index: KvIndexView | None) -> dict[int, float]:
        """Per endpoint row, the fraction of the prompt's blocks that requests credited there share.

        Only the blocks at :func:`checkpoints` are remembered (every block up to 32, then 16
        per doubling: ≤ 6% short of the true depth, 111 entries for a 1024-block prompt).
        Block hashes chain, so the rows holding a later checkpoint hold the earlier ones
        too: the walk only looks at the rows that drop out, and stops when none is left.
        """
        self.expire()
        out: dict[int, float] = {}
        if not ctx.token_ids or index is None:  # nothing is pending without an index
            return out
        for bs, pending in self.pending.items():  # almost always one block size
            hashes = ctx.cached_block_hashes(bs, index.hash_prompt)
            if not hashes:
                continue
            n = len(hashes)
            prev: dict[int, int] | None = None
            done = 0  # blocks matched up to the last checkpoint found
            for k in checkpoints(n):
                cur = pending.get(hashes[k])
                if cur is None:
                    break
                if prev is not None and len(cur) != len(prev):
                    for row in prev.keys() - cur.keys():
                        out[row] = max(out.get(row, 0.0), done / n)
                prev = cur
                done = k + 1
            for row in prev or ():
                if row not in out or out[row] < done / n:
                    out[row] = done / n
        return out


_CHECKPOINTS: list[int] = []


def checkpoints(n: int) -> list[int]:
    """Block indices below ``n`` that :class:`InFlightPrefixes` remembers: k with (k + 1) a multiple of
    ``2 ** max(0, bit_length(k + 1) − 5)``: every block up to 32, then 16 per doubling."""
    cps = _CHECKPOINTS
    if not cps or cps[-1] < n:
        k = cps[-1] + 1 if cps else 0
        while k < max(2 * n, 64):
            if (k + 1) % (1 << max(0, (k + 1).bit_length() - 5)) == 0:
                cps.append(k)
            k += 1
    return cps[: bisect.bisect_left(cps, n)]

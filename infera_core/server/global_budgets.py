"""API-key budgets global to the router replicas of a cluster: leased slices of one store.

With a discovery backend that keeps shared records (etcd, the NATS plane, Kubernetes:
:class:`~infera_core.discovery.base.SharedState`), every router process is a *participant*
that leases slices of each key's budgets from records in that store and admits requests
from its local slice, so the request path never waits on the network:

* ``requests_per_minute`` — one token bucket per key in the store (``level``, ``at`` on
  the wall clock, refilled at ``rpm / 60`` per second, capped at ``rpm``). A lease reads the
  record, refills it, takes ``n = min(want, floor(level))`` and writes it back with a
  compare-and-swap on the record's revision (an etcd transaction on ``mod_revision``; a
  JetStream KV update naming the last sequence; a ConfigMap update naming its
  ``resourceVersion``): two participants never take the same request. ``want`` is about two seconds of the key's demand at this participant.
* ``tokens_per_day`` — one counter per key and UTC day (``used``). A lease adds the tokens it
  takes to ``used``; admission reserves ``prompt + max_tokens × n`` from the local grant and
  the end of the request gives back the difference to the real cost (or owes more: a
  negative grant is paid with the next lease).

Admission is local. When a participant's slice runs low it leases more in the background;
when a request finds it empty the request waits for the one lease in flight for that key
(:class:`LeaseMiss`, bounded by :data:`~infera_core.server.budget_slices.LEASE_WAIT_S`), and when the store said the budget is
spent the participant refuses at once until the bucket can have refilled (no store traffic
per refused request). Unused slices go back to the store after :data:`SLICE_TTL_S` idle and
when the participant stops; a participant killed with a slice loses it (the cluster admits
less, never more). Participants announce themselves every :data:`HEARTBEAT_S`.

Losing the store (a lease or heartbeat fails) *degrades* a participant to a local share of
each budget: ``rpm / N`` per minute (a bucket starting empty) and ``(tpd − used) / N`` tokens,
``N`` being the participants it last saw, never unlimited. It keeps trying the store and
leaves the degraded mode at the first success; the tokens it admitted meanwhile are
written to the store then. See docs/how-to/operate.md ("Budgets across router replicas")
for the consistency model and the worst-case overshoot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from infera_core.discovery.base import SharedState
from infera_core.server.budget_slices import KeySlices, LeaseMiss, busy, refilled

log = logging.getLogger("infera.server.keys")

REFILL_AHEAD_S = 2.0
"""A lease takes about this long of the key's demand at this participant."""
SLICE_TTL_S = 10.0
"""A slice unused this long goes back to the store."""
HEARTBEAT_S = 2.0
"""How often a participant announces itself (and retries a lost store)."""
PARTICIPANT_TTL_S = 3 * HEARTBEAT_S
"""A participant not seen this long is not counted in the degraded share."""
STORE_TIMEOUT_S = 2.0
"""One store operation (a read-modify-swap, retried on conflicts) longer than this: store lost."""
PARTICIPANTS = "budgets.participants"


class GlobalBudgets:
    """The participant of one router process (``ring.share(budgets)`` like
    :class:`~infera_core.server.budgets.SharedBudgets`; :meth:`start` in the app's lifespan)."""

    capacity = 1 << 30

    def __init__(
        self,
        store: SharedState,
        participant: str,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.participant = participant
        self._clock = clock
        self._wall = wall
        self._keys: list[KeySlices] = []
        self._slots: dict[str, int] = {}
        self.down = False
        """True while the store is lost (the degraded local share applies)."""
        self.participants = 1
        """Participants seen at the last heartbeat (the degraded share's ``N``)."""
        self._task: asyncio.Task[None] | None = None

    # -- life ----------------------------------------------------------------------------
    async def start(self) -> None:
        with contextlib.suppress(Exception):  # logged; degraded until the store answers
            await self._heartbeat()
        self._task = asyncio.ensure_future(self._housekeeping())

    async def close(self) -> None:
        """Give the unused slices back and leave the participants."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        leases = [t for k in self._keys for t in (k.rate_lease, k.tok_lease) if t is not None]
        for lease in leases:
            lease.cancel()
        await asyncio.gather(*leases, return_exceptions=True)
        for k in self._keys:
            with contextlib.suppress(Exception):
                await self._give_back(k, self._clock() + SLICE_TTL_S + 1)
        with contextlib.suppress(Exception):
            await self._update(PARTICIPANTS, self._leave)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            with contextlib.suppress(Exception):  # _store logged it and marked the store lost
                await self._heartbeat()
                now = self._clock()
                for k in list(self._keys):
                    await self._give_back(k, now)

    # -- the interface KeyRing uses (as SharedBudgets's) -----------------------------------
    def slot(self, name: str) -> int:
        index = self._slots.get(name)
        if index is None:
            index = self._slots[name] = len(self._keys)
            self._keys.append(KeySlices(name))
        return index

    def set_rate(self, base: int, rpm: int | None, clock: Callable[[], float]) -> None:
        self._keys[base].rpm = rpm or 0

    def take(self, base: int, rpm: int, clock: Callable[[], float]) -> float:
        """One request of the key's ``requests_per_minute``: -1.0 when taken, else the bucket's
        level as last seen (below 1); :class:`LeaseMiss` when a lease may bring more."""
        k = self._keys[base]
        k.rpm = rpm
        k.demand += 1
        if k.allow >= 1:
            k.allow -= 1
            if k.allow * 2 < self._want_requests(k):
                self._lease_requests(k)
            return -1.0
        now = self._clock()
        if self.down:
            return self._degraded_take(k, now)
        if now < k.empty_until:
            return min(k.level, 0.99)
        raise LeaseMiss(
            self._lease_requests(k),
            f"The API key {k.name!r} is over its limit of {rpm} requests per minute.",
            "rate_limit_exceeded",
        )

    def reserve(self, base: int, day: int, n: int, limit: int) -> int:
        """Reserve ``n`` of ``day``'s ``limit`` tokens: -1 when reserved, else the tokens the
        cluster used as last seen; :class:`LeaseMiss` when a lease may bring them."""
        k = self._keys[base]
        k.tpd = limit
        self._today(k, day)
        k.tok_demand += n
        if k.grant >= n:
            k.grant -= n
            k.local += n
            if k.grant * 2 < self._want_tokens(k, 0):
                self._lease_tokens(k, 0)
            return -1
        if self.down:
            share = max(0, limit - k.used) // max(1, self.participants)
            if k.d_tokens + n > share:
                return max(k.used, limit - share + k.d_tokens)
            k.d_tokens += n
            k.grant -= n  # owed to the store once it is back
            k.local += n
            return -1
        now = self._clock()
        if now < k.full_until or n > limit:
            return max(0, k.used - max(k.grant, 0))
        if k.rpm and k.allow < 1 and now >= k.empty_until:
            self._lease_requests(k)  # the request's other budget, leased meanwhile
        raise LeaseMiss(
            self._lease_tokens(k, n),
            f"The API key {k.name!r} has no tokens leased for this request yet; retry.",
            "token_budget_exceeded",
        )

    def settle(self, base: int, day: int, delta: int) -> None:
        k = self._keys[base]
        if k.day == day:
            k.grant -= delta
            k.local += delta

    def add_tokens(self, base: int, day: int, n: int) -> None:
        k = self._keys[base]
        if not k.tpd:
            k.spent += n
            return
        self._today(k, day)
        k.grant -= n
        k.local += n

    def tokens(self, base: int, day: int) -> int:
        """The tokens the cluster spent or holds reserved on ``day``: this participant's, and
        the others' as last read (every :data:`HEARTBEAT_S` while the key is in use)."""
        k = self._keys[base]
        if not k.tpd:
            return k.spent
        return k.others + k.local if k.day == day else 0

    def held(self, name: str) -> tuple[int, int]:
        """The requests and tokens this participant holds leased for key ``name`` (diagnostics)."""
        index = self._slots.get(name)
        if index is None:
            return 0, 0
        k = self._keys[index]
        return k.allow, max(k.grant, 0)

    # -- requests_per_minute ---------------------------------------------------------------
    def _want_requests(self, k: KeySlices) -> int:
        elapsed = max(self._clock() - k.demand_since, 0.5)
        rate = max(k.rpm / 60.0, k.demand / elapsed)
        return max(1, min(k.rpm, math.ceil(rate * REFILL_AHEAD_S)))

    def _lease_requests(self, k: KeySlices) -> asyncio.Future[Any] | None:
        if k.rate_lease is None or k.rate_lease.done():
            try:
                k.rate_lease = asyncio.get_running_loop().create_task(self._rate_lease(k))
            except RuntimeError:  # no event loop (a synchronous caller): no lease
                return None
        return k.rate_lease

    async def _rate_lease(self, k: KeySlices) -> None:
        want, rpm = self._want_requests(k), k.rpm
        k.demand, k.demand_since = 0, self._clock()
        got: list[float] = []

        def lease(rec: dict[str, Any] | None) -> dict[str, Any]:
            level = refilled(rec, rpm, self._wall())
            n = min(want, math.floor(level))
            got[:] = [n, level - n]
            return {"rpm": rpm, "level": level - n, "at": max(self._wall(), (rec or {}).get("at", 0.0))}

        try:
            await self._update(k.record + ".rate", lease)
        except Exception:  # logged; the store is lost
            return
        n, k.level = int(got[0]), got[1]
        now = self._clock()
        k.allow += n
        k.allow_at = now
        if n < want and rpm:  # the bucket is spent: refuse locally until one request refilled
            k.empty_until = now + (1.0 - k.level % 1.0) / (rpm / 60.0)

    def _degraded_take(self, k: KeySlices, now: float) -> float:
        rate = k.rpm / 60.0 / max(1, self.participants)
        cap = max(1.0, k.rpm / max(1, self.participants))
        if k.d_at < 0:
            k.d_at = now  # starts empty: the share accrues from the loss of the store
        k.d_bucket = min(cap, k.d_bucket + (now - k.d_at) * rate)
        k.d_at = now
        if k.d_bucket < 1.0:
            return k.d_bucket
        k.d_bucket -= 1.0
        return -1.0

    # -- tokens_per_day --------------------------------------------------------------------
    def _today(self, k: KeySlices, day: int) -> None:
        if k.day != day:  # a new UTC day: yesterday's grant (and debt) went with it
            k.day, k.grant, k.used, k.d_tokens, k.full_until = day, 0, 0, 0, 0.0
            k.local, k.others, k.pushed, k.quiet = 0, 0, -1, 0

    def _want_tokens(self, k: KeySlices, need: int) -> int:
        elapsed = max(self._clock() - k.tok_since, 0.5)
        return max(need, math.ceil(k.tok_demand / elapsed * REFILL_AHEAD_S), 1)

    def _lease_tokens(self, k: KeySlices, need: int) -> asyncio.Future[Any] | None:
        if k.tok_lease is None or k.tok_lease.done():
            try:
                k.tok_lease = asyncio.get_running_loop().create_task(self._token_lease(k, need))
            except RuntimeError:
                return None
        return k.tok_lease

    async def _token_lease(self, k: KeySlices, need: int) -> None:
        want, day, tpd = self._want_tokens(k, need), k.day, k.tpd
        k.tok_demand, k.tok_since = 0, self._clock()
        debt = max(0, -k.grant)
        got: list[int] = []

        def lease(rec: dict[str, Any] | None) -> dict[str, Any]:
            used = rec["used"] if rec is not None and rec.get("day") == day else 0
            n = max(0, min(want, tpd - used - debt))
            got[:] = [n, used + debt + n]
            return self._account(k, rec, day, used + debt + n)

        try:
            await self._update(k.record + ".tokens", lease)
        except Exception:  # logged; the store is lost
            return
        if k.day != day:
            return
        n, k.used = got
        k.grant += debt + n  # the debt is paid: from -debt to n
        k.d_tokens = 0
        k.grant_at = self._clock()
        if n < want:
            k.full_until = k.grant_at + 1.0  # spent: refuse at once for a second

    # -- giving slices back ----------------------------------------------------------------
    async def _give_back(self, k: KeySlices, now: float) -> None:
        """Slices unused since ``now - SLICE_TTL_S`` go back; a debt is paid."""
        if self.down:
            return
        if k.allow > 0 and now - k.allow_at > SLICE_TTL_S and not busy(k.rate_lease):
            n, rpm = k.allow, k.rpm
            k.allow = 0

            def back(rec: dict[str, Any] | None) -> dict[str, Any]:
                level = min(float(rpm), refilled(rec, rpm, self._wall()) + n)
                return {"rpm": rpm, "level": level, "at": max(self._wall(), (rec or {}).get("at", 0.0))}

            try:
                await self._update(k.record + ".rate", back)
            except Exception:
                k.allow += n  # still ours: given back once the store answers
                raise
        stale = k.grant > 0 and now - k.grant_at > SLICE_TTL_S
        if (stale or k.grant < 0) and not busy(k.tok_lease):
            n, day = k.grant, k.day
            k.grant = 0

            def settle(rec: dict[str, Any] | None) -> dict[str, Any]:
                used = rec["used"] if rec is not None and rec.get("day") == day else 0
                return self._account(k, rec, day, max(0, used - n))

            try:
                await self._update(k.record + ".tokens", settle)
            except Exception:
                k.grant += n  # still ours (or still owed)
                raise
            k.used = max(0, k.used - n)
        if k.tpd and k.day >= 0:
            await self._sync_tokens(k)

    async def _sync_tokens(self, k: KeySlices) -> None:
        """Write this participant's ``local`` when it changed, read the others' while the key is
        in use here (its ``local`` changed within the last minute)."""
        if k.local != k.pushed:
            k.quiet = 0
        elif k.quiet > 60 / HEARTBEAT_S:
            return
        k.quiet += 1
        day, name = k.day, k.record + ".tokens"
        if k.local == k.pushed:
            raw, _ = await asyncio.wait_for(self.store.state_get(name), STORE_TIMEOUT_S)
            rec = json.loads(raw) if raw else None
            self._account(k, rec if isinstance(rec, dict) else None, day, 0)
            return

        def push(rec: dict[str, Any] | None) -> dict[str, Any]:
            used = rec["used"] if rec is not None and rec.get("day") == day else 0
            return self._account(k, rec, day, used)

        await self._update(name, push)

    def _account(self, k: KeySlices, rec: dict[str, Any] | None, day: int, used: int) -> dict[str, Any]:
        """The tokens record of ``day`` with ``used`` and this participant's ``local`` (what
        each participant spent or holds reserved: the sum is the key's ``tokens_today``)."""
        by: dict[str, int] = {}
        if rec is not None and rec.get("day") == day and isinstance(rec.get("by"), dict):
            by = {p: int(v) for p, v in rec["by"].items()}
        by[self.participant] = k.pushed = k.local
        k.others = sum(by.values()) - k.local
        return {"day": day, "used": used, "by": by}

    # -- the store -------------------------------------------------------------------------
    async def _heartbeat(self) -> None:
        wall = self._wall()

        def seen(rec: dict[str, Any] | None) -> dict[str, Any]:
            alive = {p: t for p, t in (rec or {}).items() if wall - float(t) < PARTICIPANT_TTL_S}
            alive[self.participant] = wall
            return alive

        rec = await self._update(PARTICIPANTS, seen)
        self.participants = max(1, len(rec))

    def _leave(self, rec: dict[str, Any] | None) -> dict[str, Any]:
        return {p: t for p, t in (rec or {}).items() if p != self.participant}

    async def _update(
        self, name: str, change: Callable[[dict[str, Any] | None], dict[str, Any]]
    ) -> dict[str, Any]:
        """Read ``name``, apply ``change``, write it back if nobody wrote meanwhile (else
        again); the store lost (logged once, degraded mode) on any failure or timeout."""
        try:
            rec = await asyncio.wait_for(self._swap(name, change), STORE_TIMEOUT_S)
        except Exception as exc:
            if not self.down:
                log.error(
                    "API-key budgets: the %s store is lost (%s); each key now gets 1/%d of its budgets "
                    "here until it is back",
                    getattr(self.store, "state_source", "shared"),
                    str(exc) or type(exc).__name__,
                    self.participants,
                )
            self.down = True
            raise
        if self.down:
            log.warning("API-key budgets: the shared store is back; budgets are global again")
            self.down = False
            for k in self._keys:
                k.d_at, k.d_bucket = -1.0, 0.0
        return rec

    async def _swap(
        self, name: str, change: Callable[[dict[str, Any] | None], dict[str, Any]]
    ) -> dict[str, Any]:
        while True:
            raw, revision = await self.store.state_get(name)
            rec = json.loads(raw) if raw else None
            new = change(rec if isinstance(rec, dict) else None)
            if await self.store.state_swap(name, json.dumps(new).encode(), revision):
                return new

"""What one router holds of each API key's cluster-wide budgets (:mod:`infera_core.server.global_budgets`):
its leased slices, its degraded local share, and the 429 that waits for a lease."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from typing import Any

from infera_core.server.errors import ApiError

LEASE_WAIT_S = 1.0
"""The longest a request waits for a lease when its participant's slice is empty."""


class LeaseMiss(ApiError):
    """The participant's slice is empty; :meth:`wait` for the lease in flight and try again
    (a plain 429 to a caller that does not)."""

    def __init__(self, lease: asyncio.Future[Any] | None, message: str, code: str) -> None:
        super().__init__(429, message, code=code, headers={"Retry-After": "1"})
        self.lease = lease

    async def wait(self) -> None:
        if self.lease is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self.lease), LEASE_WAIT_S)


class KeySlices:
    """One key's slices at this participant."""

    __slots__ = (
        "allow",
        "allow_at",
        "d_at",
        "d_bucket",
        "d_tokens",
        "day",
        "demand",
        "demand_since",
        "empty_until",
        "full_until",
        "grant",
        "grant_at",
        "level",
        "local",
        "name",
        "others",
        "pushed",
        "quiet",
        "rate_lease",
        "record",
        "rpm",
        "spent",
        "tok_demand",
        "tok_lease",
        "tok_since",
        "tpd",
        "used",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.record = "budgets." + hashlib.sha256(name.encode()).hexdigest()[:32]
        self.rpm = 0
        self.tpd = 0
        self.allow = 0  # requests leased, unused
        self.allow_at = 0.0
        self.level = 0.0  # the store's bucket as last seen
        self.empty_until = 0.0
        self.demand = 0
        self.demand_since = 0.0
        self.rate_lease: asyncio.Task[None] | None = None
        self.day = -1
        self.grant = 0  # tokens leased for ``day``, unused (negative: owed to the store)
        self.grant_at = 0.0
        self.used = 0  # the store's ``used`` as last seen
        self.full_until = 0.0
        self.tok_demand = 0
        self.tok_since = 0.0
        self.tok_lease: asyncio.Task[None] | None = None
        self.d_bucket = 0.0  # the degraded local bucket
        self.d_at = -1.0
        self.d_tokens = 0  # tokens admitted from the degraded share today
        self.spent = 0  # tokens of a key without tokens_per_day (usage only)
        self.local = 0  # tokens this participant spent or holds reserved today
        self.pushed = -1  # ``local`` as last written to the store
        self.others = 0  # the other participants' ``local``, as last read
        self.quiet = 0  # heartbeats since ``local`` last changed


def refilled(rec: dict[str, Any] | None, rpm: int, wall: float) -> float:
    """The bucket of ``rec`` refilled up to ``wall`` (full when new; a changed limit caps it)."""
    if rec is None:
        return float(rpm)
    level = min(float(rec.get("level", rpm)), float(rpm))
    return min(float(rpm), level + max(0.0, wall - float(rec.get("at", wall))) * rpm / 60.0)


def busy(task: asyncio.Task[None] | None) -> bool:
    return task is not None and not task.done()

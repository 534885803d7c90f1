"""Lease keepalive for many registrations over one gRPC stream.

etcd's ``LeaseKeepAlive`` is a bidirectional stream: one request per lease refresh, one
response each carrying the lease's new TTL (``TTL <= 0``: the lease is gone). Opening a
stream per refresh (``aetcd.Client.refresh_lease``) costs ~1 ms of CPU each; sharing one
stream for every lease of a process makes 1000 registrations cheap. When the stream
breaks (etcd restart, network) it is reopened after a short delay.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from aetcd import rpc

from infera_core.discovery.etcd_client import ETCD_ERRORS, EtcdConnection
from infera_core.util.tasks import cancel_and_wait


class LeasedKey(Protocol):
    """A key held alive by a lease (:class:`infera_core.discovery.etcd.EtcdRegistration`)."""

    key: str
    lease_id: int
    keepalives: int

    async def regrant(self) -> None:
        """Grant a new lease and put the key again under it (the old one expired)."""
        ...


log = logging.getLogger("infera.discovery.etcd")

RETRY_DELAY = 0.25


class LeaseKeeper:
    """Refreshes every added registration's lease each ``interval`` seconds."""

    def __init__(self, conn: EtcdConnection, interval: float) -> None:
        self._conn = conn
        self.interval = interval
        self._leases: dict[int, LeasedKey] = {}
        self._task: asyncio.Task[None] | None = None
        self._regranting: set[int] = set()
        self._pending: set[asyncio.Task[None]] = set()

    def add(self, reg: LeasedKey) -> None:
        self._leases[reg.lease_id] = reg
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="etcd-lease-keeper")

    def remove(self, reg: LeasedKey) -> None:
        if self._leases.get(reg.lease_id) is reg:
            del self._leases[reg.lease_id]

    def rekey(self, old_lease: int, reg: LeasedKey) -> None:
        self._leases.pop(old_lease, None)
        self._leases[reg.lease_id] = reg

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        failing = False
        while self._leases:
            call: Any = None
            reader: asyncio.Task[None] | None = None
            try:
                client = self._conn.client
                call = client.leasestub.LeaseKeepAlive(metadata=client.metadata)
                reader = asyncio.get_running_loop().create_task(self._read(call))
                loop = asyncio.get_running_loop()
                while self._leases:
                    next_round = loop.time() + self.interval  # a fixed cadence, however long writing takes
                    for lease_id in list(self._leases):
                        await call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
                    await asyncio.wait({reader}, timeout=max(0.0, next_round - loop.time()))
                    if reader.done():
                        reader.result()  # raises what broke the stream
                        raise ConnectionError("etcd closed the keepalive stream")
                    if failing:
                        log.info("etcd: lease keepalives work again (%d leases)", len(self._leases))
                        failing = False
            except _STREAM_ERRORS as exc:
                if not failing:
                    log.warning("etcd: lease keepalive stream failed (%s); retrying", _short(exc))
                failing = True
            finally:
                if reader is not None:
                    reader.cancel()
                if call is not None:
                    call.cancel()
            await asyncio.sleep(RETRY_DELAY)

    async def _read(self, call: Any) -> None:
        while True:
            response = await call.read()
            if not isinstance(response, rpc.LeaseKeepAliveResponse):  # grpc.aio.EOF: stream over
                return
            reg = self._leases.get(response.ID)
            if reg is None:
                continue
            if response.TTL > 0:
                reg.keepalives += 1
            elif response.ID not in self._regranting:
                self._regranting.add(response.ID)
                task = asyncio.get_running_loop().create_task(self._regrant(response.ID, reg))
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)

    async def _regrant(self, old_lease: int, reg: LeasedKey) -> None:
        try:
            await reg.regrant()
        except ETCD_ERRORS as exc:
            log.warning("etcd: re-granting the lease of %s failed (%s); will retry", reg.key, _short(exc))
            return
        finally:
            self._regranting.discard(old_lease)
        self.rekey(old_lease, reg)


_STREAM_ERRORS: tuple[type[BaseException], ...] = (*ETCD_ERRORS, asyncio.InvalidStateError)
"""What breaks the keepalive stream (ConnectionError is an OSError); InvalidStateError is gRPC's
"RPC already finished": a write after etcd ended the stream (it went away between two rounds)."""


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]

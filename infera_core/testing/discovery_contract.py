"""A contract test suite for discovery backends (third-party ones included).

Subclass :class:`DiscoveryContract` in a test module and implement ``make_discovery``
(two calls must return two clients of the *same* fleet)::

    class TestMyBackend(DiscoveryContract):
        lease_ttl = 2.0                      # registrations expire this long after heartbeats stop

        async def make_discovery(self) -> Discovery:
            return MyBackend(...)

        def stop_backend(self) -> None:      # optional: an outage (server process stopped)…
            self.server.stop()

        def start_backend(self) -> None:     # …and the same server back, its state kept
            self.server.start()

Checks that need ``lease_ttl`` or the outage methods are skipped when those are not given.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from infera_core.discovery.base import ChangeKind, Discovery, FleetChange, Registration, SharedState
from infera_core.errors import DiscoveryError
from infera_core.worker import Status, WorkerRecord


def contract_record(worker_id: str, **kw: object) -> WorkerRecord:
    data = {"worker_id": worker_id, "url": f"http://127.0.0.1:9/{worker_id}", "model": "m", "engine": "sim"}
    return WorkerRecord.model_validate({**data, **kw})


async def _next(stream: AsyncIterator[FleetChange], within: float = 5.0) -> FleetChange:
    async with asyncio.timeout(within):
        return await anext(stream)


async def register_until(discovery: Discovery, record: WorkerRecord, within: float) -> Registration:
    """Register, retrying while the backend is unreachable (``DiscoveryError``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        try:
            return await discovery.register(record)
        except DiscoveryError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.2)


class DiscoveryContract:
    """What every backend that accepts registrations must do."""

    lease_ttl: float | None = None
    """Seconds after which a registration whose heartbeats stopped is gone (None: no leases)."""

    async def make_discovery(self) -> Discovery:
        raise NotImplementedError

    def stop_backend(self) -> None:
        """Stop the backend's server (an outage); not implemented: outage checks are skipped."""
        raise NotImplementedError

    def start_backend(self) -> None:
        """Start it again after :meth:`stop_backend`, with its stored state."""
        raise NotImplementedError

    async def _pair(self) -> tuple[Discovery, Discovery]:
        one, two = await self.make_discovery(), await self.make_discovery()
        await one.start()
        await two.start()
        return one, two

    async def test_register_list_deregister(self) -> None:
        launcher, router = await self._pair()
        try:
            reg = await launcher.register(contract_record("c1"))
            assert isinstance(reg, Registration)
            assert [r.worker_id for r in await router.list_workers()] == ["c1"]
            await reg.deregister()
            await reg.deregister()  # idempotent
            assert await router.list_workers() == []
        finally:
            await launcher.close()
            await router.close()

    async def test_the_record_round_trips(self) -> None:
        launcher, router = await self._pair()
        try:
            record = contract_record("c1", lora_adapters=["sql-lora", "chat-lora"], labels={"zone": "a"})
            reg = await launcher.register(record)
            (seen,) = await router.list_workers()
            assert seen.lora_adapters == ["sql-lora", "chat-lora"] and seen.labels == {"zone": "a"}
            await reg.deregister()
        finally:
            await launcher.close()
            await router.close()

    async def test_duplicate_worker_id_is_an_error(self) -> None:
        launcher, other = await self._pair()
        try:
            reg = await launcher.register(contract_record("c1"))
            with pytest.raises(DiscoveryError, match="c1"):
                await other.register(contract_record("c1", url="http://127.0.0.1:9/other"))
            await reg.deregister()
        finally:
            await launcher.close()
            await other.close()

    async def test_shared_state_compare_and_swap(self) -> None:
        """A backend with :class:`SharedState`: absent is ``(None, 0)``; a swap naming a stale
        revision loses, so of two routers racing on one record exactly one wins."""
        one, two = await self._pair()
        try:
            if not isinstance(one, SharedState) or not isinstance(two, SharedState):
                pytest.skip("the backend keeps no shared state (SharedState)")
            assert await one.state_get("contract.x") == (None, 0)
            assert await one.state_swap("contract.x", b"1", 0)
            assert not await two.state_swap("contract.x", b"2", 0)  # it exists now
            value, revision = await two.state_get("contract.x")
            assert value == b"1" and revision > 0
            assert await two.state_swap("contract.x", b"2", revision)
            assert not await one.state_swap("contract.x", b"3", revision)  # stale
            assert (await one.state_get("contract.x"))[0] == b"2"
        finally:
            await one.close()
            await two.close()

    async def test_watch_sees_current_workers_then_changes(self) -> None:
        launcher, router = await self._pair()
        existing = await launcher.register(contract_record("c0"))
        stream = router.watch(sync_marker=True)
        try:
            change = await _next(stream)
            assert (change.kind, change.worker_id) == (ChangeKind.PUT, "c0")  # current workers first
            assert (await _next(stream)).kind is ChangeKind.SYNCED  # empty fleet loaded
            first = await launcher.register(contract_record("c1"))
            change = await _next(stream)
            assert (change.kind, change.worker_id) == (ChangeKind.PUT, "c1")
            await first.update(contract_record("c1", status="draining"))
            change = await _next(stream)
            assert change.kind is ChangeKind.PUT and change.record is not None
            assert change.record.status is Status.DRAINING
            await first.deregister()
            change = await _next(stream)
            assert (change.kind, change.worker_id) == (ChangeKind.DELETE, "c1")
            assert change.record is not None and change.record.worker_id == "c1"
            await existing.deregister()
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
            await launcher.close()
            await router.close()

    async def test_a_worker_whose_heartbeats_stop_expires(self) -> None:
        if self.lease_ttl is None:
            pytest.skip("the backend has no leases (lease_ttl is None)")
        launcher, router = await self._pair()
        stream = router.watch()
        try:
            await launcher.register(contract_record("gone"))
            change = await _next(stream)
            assert (change.kind, change.worker_id) == (ChangeKind.PUT, "gone")
            await launcher.close()  # heartbeats stop without a deregistration (a crashed launcher)
            # generous, from the TTL: a loaded machine delays the expiry well past lease_ttl
            # (heartbeat timing, the server's expiry sweep); only a broken backend waits it out
            change = await _next(stream, within=10 * self.lease_ttl + 10)
            assert (change.kind, change.worker_id) == (ChangeKind.DELETE, "gone")
            assert await router.list_workers() == []
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
            await router.close()

    async def test_changes_during_an_outage_are_seen_when_it_ends(self) -> None:
        if type(self).stop_backend is DiscoveryContract.stop_backend:
            pytest.skip("stop_backend/start_backend are not implemented")
        launcher, router = await self._pair()
        other = await self.make_discovery()
        await other.start()
        leaving_reg = await launcher.register(contract_record("a"))
        await launcher.register(contract_record("b"))
        stream = router.watch(sync_marker=True)
        seen: dict[str, WorkerRecord] = {}

        async def until_fleet(expected: set[str], within: float) -> None:
            async with asyncio.timeout(within):
                while set(seen) != expected:
                    change = await anext(stream)
                    if change.kind is ChangeKind.PUT and change.record is not None:
                        seen[change.worker_id] = change.record
                    elif change.kind is ChangeKind.DELETE:
                        seen.pop(change.worker_id, None)

        try:
            await until_fleet({"a", "b"}, 5)
            self.stop_backend()
            leaving = asyncio.ensure_future(leaving_reg.deregister())  # "a" leaves during the outage
            joining = asyncio.ensure_future(register_until(other, contract_record("c"), within=20))
            await asyncio.sleep(0.5)  # let both try (and fail) while the backend is down
            self.start_backend()
            async with asyncio.timeout(20):
                await asyncio.gather(leaving, joining)
            await until_fleet({"b", "c"}, 20)
            assert sorted(r.worker_id for r in await router.list_workers()) == ["b", "c"]
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
            for d in (launcher, router, other):
                await d.close()

"""A contract test suite for discovery backends (third-party ones included).

Subclass :class:`DiscoveryContract` in a test module and implement ``make_discovery``
(two calls must return two clients of the *same* fleet)::

    class TestMyBackend(DiscoveryContract):
        async def make_discovery(self) -> Discovery:
            return MyBackend(...)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from infera_core.discovery.base import ChangeKind, Discovery, FleetChange, Registration
from infera_core.errors import DiscoveryError
from infera_core.worker import Status, WorkerRecord


def contract_record(worker_id: str, **kw: object) -> WorkerRecord:
    data = {"worker_id": worker_id, "url": f"http://127.0.0.1:9/{worker_id}", "model": "m", "engine": "sim"}
    return WorkerRecord.model_validate({**data, **kw})


async def _next(stream: AsyncIterator[FleetChange], within: float = 5.0) -> FleetChange:
    async with asyncio.timeout(within):
        return await anext(stream)


class DiscoveryContract:
    """What every backend that accepts registrations must do."""

    async def make_discovery(self) -> Discovery:
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

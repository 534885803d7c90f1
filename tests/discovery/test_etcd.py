"""The etcd discovery backend against a real etcd (started per test on a free loopback port)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

import aetcd
import pytest

from infera_core.discovery.base import DiscoverySettings
from infera_core.discovery.etcd import EtcdDiscovery, EtcdRegistration
from infera_core.discovery.etcd_client import parse_endpoints
from infera_core.discovery.view import FleetView
from infera_core.errors import DiscoveryError
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import eventually
from infera_core.util.net import free_port
from infera_core.worker import Status, WorkerRecord

pytestmark = pytest.mark.etcd


def rec(worker_id: str, **kw: object) -> WorkerRecord:
    data = {"worker_id": worker_id, "url": f"http://127.0.0.1:9/{worker_id}", "model": "m", "engine": "sim"}
    return WorkerRecord.model_validate({**data, **kw})


def settings(server: EtcdServer, **kw: object) -> DiscoverySettings:
    s = DiscoverySettings(etcd_endpoints=[server.url], lease_ttl=2.0, connect_timeout=2.0)
    for k, v in kw.items():
        setattr(s, k, v)
    return s


async def started(s: DiscoverySettings) -> EtcdDiscovery:
    d = EtcdDiscovery(s)
    await d.start()
    return d


async def raw_client(server: EtcdServer) -> AsyncIterator[aetcd.Client]:
    host, port = server.endpoint.split(":")
    client = aetcd.Client(host=host, port=int(port), timeout=2)
    try:
        yield client
    finally:
        await client.close()


def test_endpoint_forms() -> None:
    assert parse_endpoints(["10.0.0.1:2379", "http://h:1,  h2 ", "http://[::1]:5/"]) == [
        ("10.0.0.1", 2379),
        ("h", 1),
        ("h2", 2379),
        ("::1", 5),
    ]
    with pytest.raises(DiscoveryError, match="only http://"):
        parse_endpoints(["https://h:1"])
    with pytest.raises(DiscoveryError, match="not a number"):
        parse_endpoints(["h:port"])


async def test_register_watch_update_deregister(etcd_server: EtcdServer) -> None:
    launcher, router = await started(settings(etcd_server)), await started(settings(etcd_server))
    view = FleetView(router)
    await view.start()
    t0 = time.monotonic()
    reg = await launcher.register(rec("w1"))
    await view.wait_for(lambda v: v.is_routable("w1"), within=1)
    assert time.monotonic() - t0 < 1
    with pytest.raises(DiscoveryError, match=r"'w1' is already registered .*http://127.0.0.1:9/w1"):
        await (await started(settings(etcd_server))).register(rec("w1", url="http://other:1"))
    await reg.update(rec("w1", status="draining"))
    await view.wait_for(lambda v: "w1" in v.workers and not v.is_routable("w1"), within=1)
    assert view.workers["w1"].status is Status.DRAINING
    await reg.deregister()
    await view.wait_for(lambda v: not v.workers, within=1)
    assert await router.list_workers() == []
    await view.stop()
    await launcher.close()
    await router.close()


async def test_keepalive_holds_the_record_past_its_ttl_and_regrants_a_lost_lease(
    etcd_server: EtcdServer,
) -> None:
    launcher = await started(settings(etcd_server, lease_ttl=1.0))
    reg = await launcher.register(rec("w1"))
    assert isinstance(reg, EtcdRegistration)
    await asyncio.sleep(2.5)  # 2.5 × TTL
    assert [r.worker_id for r in await launcher.list_workers()] == ["w1"]
    assert reg.keepalives >= 3
    old_lease = reg.lease_id
    async for client in raw_client(etcd_server):
        await client.revoke_lease(old_lease)  # as if the lease expired during a partition
    await eventually(lambda: reg.regrants > 0, within=3)
    assert reg.regrants == 1 and reg.lease_id != old_lease
    assert [r.worker_id for r in await launcher.list_workers()] == ["w1"]
    await reg.deregister()
    await launcher.close()


async def test_closed_discovery_lets_the_lease_expire(etcd_server: EtcdServer) -> None:
    launcher, router = (
        await started(settings(etcd_server, lease_ttl=1.0)),
        await started(settings(etcd_server)),
    )
    await launcher.register(rec("gone"))
    view = FleetView(router)
    await view.start()
    assert "gone" in view.workers
    await launcher.close()  # stops heartbeats without deleting: like a crashed launcher
    t0 = time.monotonic()
    await view.wait_for(lambda v: not v.workers, within=4)
    assert time.monotonic() - t0 < 1.0 + 2.0
    await view.stop()
    await router.close()


async def test_unreachable_etcd_is_one_clear_error_within_the_timeout() -> None:
    dead = f"127.0.0.1:{free_port()},http://127.0.0.1:{free_port()}"
    disc = EtcdDiscovery(DiscoverySettings(etcd_endpoints=[dead], connect_timeout=1.5))
    t0 = time.monotonic()
    with pytest.raises(DiscoveryError) as err:
        await disc.start()
    assert time.monotonic() - t0 < 1.5 + 1.0
    message = str(err.value)
    assert "cannot reach etcd" in message and "--etcd-endpoint" in message
    assert dead.split(",")[0] in message and "\n" not in message
    with pytest.raises(DiscoveryError, match="--etcd-endpoint"):
        EtcdDiscovery(DiscoverySettings(etcd_endpoints=[]))


async def test_malformed_record_is_skipped_and_logged(
    etcd_server: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    router = await started(settings(etcd_server))
    view = FleetView(router)
    async for client in raw_client(etcd_server):
        await client.put(b"/infera/workers/bad-json", b"{not json")
        await client.put(b"/infera/workers/good", rec("good").to_json())
        with caplog.at_level(logging.WARNING, logger="infera.discovery"):
            await view.start()
            assert set(view.workers) == {"good"}
            await client.put(
                b"/infera/workers/no-url", b'{"worker_id": "no-url", "model": "m", "engine": "x"}'
            )
            newer = {**rec("late").model_dump(mode="json"), "schema_version": 2, "added_later": {"x": 1}}
            await client.put(b"/infera/workers/late", json.dumps(newer).encode())  # unknown fields: ignored
            await view.wait_for(lambda v: "late" in v.workers, within=2)
    assert set(view.workers) == {"good", "late"}
    logged = caplog.text
    assert "/infera/workers/bad-json" in logged and "/infera/workers/no-url" in logged and "url" in logged
    await view.stop()
    await router.close()


async def _until_registered(disc: EtcdDiscovery, record: WorkerRecord, within: float) -> EtcdRegistration:
    deadline = time.monotonic() + within
    while True:
        try:
            reg = await disc.register(record)
            assert isinstance(reg, EtcdRegistration)
            return reg
        except DiscoveryError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_view_converges_after_an_etcd_outage(etcd_server: EtcdServer) -> None:
    s = settings(etcd_server, lease_ttl=5.0)
    a_side, c_side, router = await started(s), await started(s), await started(s)
    reg_a = await a_side.register(rec("a"))
    await a_side.register(rec("b"))
    view = FleetView(router)
    await view.start()
    assert set(view.workers) == {"a", "b"}

    etcd_server.stop()
    leaving = asyncio.create_task(reg_a.deregister(retry_for=15))  # "a" deregisters during the outage
    joining = asyncio.create_task(_until_registered(c_side, rec("c"), within=15))  # "c" registers
    await asyncio.sleep(2.5)
    assert set(view.workers) == {"a", "b"}  # nothing to learn while etcd is down
    etcd_server.start()
    await asyncio.wait_for(asyncio.gather(leaving, joining), 10)

    async def etcd_content() -> set[str]:
        return {r.worker_id for r in await router.list_workers()}

    assert await etcd_content() == {"b", "c"}
    await view.wait_for(lambda v: set(v.workers) == {"b", "c"}, within=5)
    await view.stop()
    for d in (a_side, c_side, router):
        await d.close()


class _CompactsAfterFirstRead(EtcdDiscovery):
    """Real etcd activity in the window between the prefix read and the watch creation:
    a worker joins and the history is compacted, so the watch from revision+1 is refused."""

    reads = 0

    async def _read(self) -> tuple[dict[str, WorkerRecord], int]:
        fresh, revision = await super()._read()
        self.reads += 1
        if self.reads == 1:
            client = self.conn.client
            await client.put(b"/infera/workers/raced", rec("raced").to_json())
            await client.put(b"/infera/workers/filler", b"{}")
            await client.delete(b"/infera/workers/filler")
            current = (await client.get_prefix(b"/infera/")).header.revision
            await client.compact(current)
        return fresh, revision


async def test_compacted_revision_falls_back_to_a_full_reread(etcd_server: EtcdServer) -> None:
    router = _CompactsAfterFirstRead(settings(etcd_server))
    await router.start()
    view = FleetView(router)
    await view.start()
    await view.wait_for(lambda v: "raced" in v.workers, within=3)
    assert router.reads >= 2 and set(view.workers) == {"raced"}
    await view.stop()
    await router.close()


async def test_keepalives_resume_after_an_etcd_restart(etcd_server: EtcdServer) -> None:
    launcher = await started(settings(etcd_server, lease_ttl=1.0))
    reg = await launcher.register(rec("w1"))
    etcd_server.stop()
    await asyncio.sleep(1.0)
    etcd_server.start()
    before = reg.keepalives
    await asyncio.sleep(3.0)  # 3 × TTL: without resumed keepalives the record would be gone
    assert reg.keepalives > before
    assert [r.worker_id for r in await launcher.list_workers()] == ["w1"]
    await reg.deregister()
    await launcher.close()


async def test_first_reachable_endpoint_of_a_list_is_used(etcd_server: EtcdServer) -> None:
    endpoints = f"127.0.0.1:{free_port()},{etcd_server.url}"
    disc = EtcdDiscovery(DiscoverySettings(etcd_endpoints=[endpoints], connect_timeout=2))
    await disc.start()
    reg = await disc.register(rec("w1"))
    assert disc.conn.endpoint == etcd_server.endpoint
    assert [r.worker_id for r in await disc.list_workers()] == ["w1"]
    await reg.deregister()
    await disc.close()

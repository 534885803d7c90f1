"""Ghost workers are impossible: one worker id everywhere, against a real etcd.

A record stored at ``/infera/workers/<key>`` whose ``worker_id`` says something else used
to enter the router's table under the record's id, while the key's deletion removed the
key's id: the worker stayed in rotation for ever and requests to it failed with 502.
Such a record is now rejected with a log line naming the key and both ids.
"""

from __future__ import annotations

import logging

import pytest

from infera_core.discovery.base import ChangeKind, DiscoverySettings, FleetChange
from infera_core.discovery.etcd import EtcdDiscovery
from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.discovery.view import FleetView
from infera_core.server.fleet import EndpointTable
from infera_core.testing.etcd import EtcdServer
from infera_core.worker import WorkerRecord

pytestmark = pytest.mark.etcd


def rec(worker_id: str) -> WorkerRecord:
    return WorkerRecord(worker_id=worker_id, url=f"http://127.0.0.1:9/{worker_id}", model="m", engine="sim")


async def test_a_record_whose_id_disagrees_with_its_key_never_becomes_a_worker(
    etcd_server: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    import aetcd

    host, port = etcd_server.endpoint.split(":")
    client = aetcd.Client(host=host, port=int(port), timeout=2)
    router = EtcdDiscovery(DiscoverySettings(etcd_endpoints=[etcd_server.url], connect_timeout=2.0))
    await router.start()
    view = FleetView(router)
    table = EndpointTable()
    view.subscribe(table.apply)
    try:
        with caplog.at_level(logging.WARNING, logger="infera.discovery"):
            # present at start-up (the initial read) and put while watching (the watch path)
            await client.put(b"/infera/workers/key-a", rec("other-a").to_json())
            await client.put(b"/infera/workers/good", rec("good").to_json())
            await view.start()
            await client.put(b"/infera/workers/key-b", rec("other-b").to_json())
            await client.put(b"/infera/workers/late", rec("late").to_json())
            await view.wait_for(lambda v: "late" in v.workers, within=5)
            assert set(view.workers) == {"good", "late"}
            assert set(table.by_id) == {"good", "late"}
            # a good record overwritten with a disagreeing one: the worker goes away
            await client.put(b"/infera/workers/good", rec("impostor").to_json())
            await view.wait_for(lambda v: "good" not in v.workers, within=5)
            for key in (b"key-a", b"key-b", b"good", b"late"):
                await client.delete(b"/infera/workers/" + key)
            await view.wait_for(lambda v: not v.workers, within=5)
        assert table.by_id == {}  # nothing left behind: no ghost
        logged = caplog.text
        for name, claimed in (("key-a", "other-a"), ("key-b", "other-b"), ("good", "impostor")):
            assert f"/infera/workers/{name}" in logged and repr(claimed) in logged
    finally:
        await view.stop()
        await router.close()
        await client.close()


async def test_the_view_rejects_a_change_whose_record_has_another_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Any backend: the fleet view itself refuses a PUT filed under another id."""
    view = FleetView(MemoryDiscovery(MemoryStore()))
    table = EndpointTable()
    view.subscribe(table.apply)
    await view.start()
    try:
        await view._apply(FleetChange(ChangeKind.PUT, "w1", rec("w1")))
        with caplog.at_level(logging.WARNING, logger="infera.discovery.view"):
            await view._apply(FleetChange(ChangeKind.PUT, "w1", rec("w2")))
        assert "'w2'" in caplog.text and "'w1'" in caplog.text
        assert dict(view.workers) == {} and table.by_id == {}  # w1's id now names a bad record
        await view._apply(FleetChange(ChangeKind.DELETE, "w1", None))
        assert table.by_id == {}
    finally:
        await view.stop()

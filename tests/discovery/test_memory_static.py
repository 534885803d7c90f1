"""The memory and static discovery backends, and the FleetView on top of them."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from infera_core.discovery.base import ChangeKind, DiscoverySettings, FleetChange
from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.discovery.static import StaticDiscovery, StaticDiscoveryFactory
from infera_core.discovery.view import FleetView
from infera_core.errors import DiscoveryError
from infera_core.testing.fixtures import make_hooks
from infera_core.worker import Status, WorkerRecord


def rec(worker_id: str, **kw: object) -> WorkerRecord:
    return WorkerRecord.model_validate(
        {
            "worker_id": worker_id,
            "url": f"http://127.0.0.1:1/{worker_id}",
            "model": "m",
            "engine": "sim",
            **kw,
        }
    )


async def test_core_registers_three_backends() -> None:
    names = make_hooks(installed=True).catalog().discovery.names()
    assert {"etcd", "memory", "static"} <= set(names)


async def test_memory_backend_shares_the_fleet_between_discoveries() -> None:
    store = MemoryStore()
    launcher_side, router_side = MemoryDiscovery(store), MemoryDiscovery(store)
    view = FleetView(router_side)
    await view.start()
    reg = await launcher_side.register(rec("a"))
    await view.wait_for(lambda v: v.is_routable("a"), within=1)
    with pytest.raises(DiscoveryError, match="already registered"):
        await launcher_side.register(rec("a"))
    await reg.update(rec("a", status="draining"))
    await view.wait_for(lambda v: "a" in v.workers and not v.is_routable("a"), within=1)
    assert view.workers["a"].status is Status.DRAINING
    await reg.deregister()
    await view.wait_for(lambda v: "a" not in v.workers, within=1)
    assert await router_side.list_workers() == []
    await view.stop()
    await router_side.close()


async def test_memory_default_store_is_process_wide() -> None:
    factory = make_hooks().catalog().discovery.get("memory")
    one, two = factory.create(DiscoverySettings()), factory.create(DiscoverySettings())
    reg = await one.register(rec("process-wide"))
    try:
        assert [r.worker_id for r in await two.list_workers()] == ["process-wide"]
    finally:
        await reg.deregister()


async def test_fleet_view_callbacks_stream_and_hooks() -> None:
    store = MemoryStore()
    disc = MemoryDiscovery(store)
    seen: list[tuple[ChangeKind, str]] = []
    view = FleetView(disc)
    unsubscribe = view.subscribe(lambda c: seen.append((c.kind, c.worker_id)))
    await view.start()
    stream: list[FleetChange] = []

    async def consume() -> None:
        async for change in view.changes():
            stream.append(change)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)
    reg = await disc.register(rec("w1"))
    await disc.register(rec("w2"))
    await reg.deregister()
    await view.wait_for(lambda v: set(v.workers) == {"w2"}, within=1)
    await asyncio.sleep(0.05)
    assert seen == [(ChangeKind.PUT, "w1"), (ChangeKind.PUT, "w2"), (ChangeKind.DELETE, "w1")]
    assert [(c.kind, c.worker_id) for c in stream] == seen
    assert stream[-1].record is not None and stream[-1].record.worker_id == "w1"
    unsubscribe()
    await disc.register(rec("w3"))
    await view.wait_for(lambda v: "w3" in v.workers, within=1)
    assert len(seen) == 3
    assert [r.worker_id for r in view.routable()] == ["w2", "w3"]
    task.cancel()
    await view.stop()


def write(path: Path, data: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data) if path.suffix == ".json" else _yaml(data))
    os.replace(tmp, path)
    # make sure the mtime differs from the previous write even on coarse clocks
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def _yaml(data: object) -> str:
    import yaml

    return str(yaml.safe_dump(data))


async def test_static_file_partial_records_and_reload(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    write(path, {"workers": [{"url": "http://10.0.0.5:8000", "model": "qwen"}]})
    disc = StaticDiscoveryFactory().create(
        DiscoverySettings(static_file=str(path), static_poll_interval=0.05)
    )
    await disc.start()
    (only,) = await disc.list_workers()
    assert (only.worker_id, only.engine, only.model) == ("10.0.0.5:8000", "unknown", "qwen")
    view = FleetView(disc)
    await view.start()
    assert set(view.workers) == {"10.0.0.5:8000"}
    write(
        path,
        [
            {"worker_id": "big", "url": "http://10.0.0.6:8000", "model": "qwen", "engine": "vllm"},
            {"url": "http://10.0.0.7:8000", "model": "qwen", "status": "draining"},
        ],
    )
    await view.wait_for(lambda v: set(v.workers) == {"big", "10.0.0.7:8000"}, within=2)
    assert view.is_routable("big") and not view.is_routable("10.0.0.7:8000")
    await view.stop()
    await disc.close()


async def test_static_file_errors_are_clear(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    write(path, [{"url": "http://h:1"}])
    disc = StaticDiscovery(path)
    with pytest.raises(DiscoveryError, match=r"fleet.json: worker #1: model: Field required"):
        await disc.start()
    path.write_text("[{")
    with pytest.raises(DiscoveryError, match="not valid JSON"):
        await disc.start()
    with pytest.raises(DiscoveryError, match="--static-file"):
        StaticDiscoveryFactory().create(DiscoverySettings())
    write(path, [{"url": "http://h:1", "model": "m"}])
    await disc.start()
    with pytest.raises(DiscoveryError, match="read-only"):
        await disc.register(rec("x"))


async def test_static_watch_keeps_last_good_fleet_on_a_broken_edit(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    write(path, [{"url": "http://h:1", "model": "m"}])
    disc = StaticDiscovery(path, poll_interval=0.05)
    view = FleetView(disc)
    await view.start()
    path.write_text("workers: [ {")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000))
    await asyncio.sleep(0.3)
    assert set(view.workers) == {"h:1"}
    write(path, [])
    started = time.monotonic()
    await view.wait_for(lambda v: not v.workers, within=2)
    assert time.monotonic() - started < 2
    await view.stop()
    await disc.close()

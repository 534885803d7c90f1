"""The ``kubernetes`` discovery backend against a stand-in API server (real HTTP, list/watch)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from infera_k8s.discovery import KubernetesDiscovery
from infera_k8s.settings import KubernetesSettings
from infera_k8s.testing import StandinApiServer, label_matches, make_pod

from infera_core.discovery.base import ChangeKind, FleetChange
from infera_core.errors import DiscoveryError
from infera_core.testing.discovery_contract import contract_record
from infera_core.testing.server import until
from infera_core.util.net import free_port
from infera_core.worker import Role, Status

SELECTOR = {"app.kubernetes.io/component": "infera-worker"}


def worker_pod(
    name: str,
    *,
    ip: str = "10.0.0.1",
    ready: bool = True,
    role: str = "mixed",
    notes: dict[str, str] | None = None,
) -> dict[str, Any]:
    labels = {**SELECTOR, "infera.io/engine": "vllm", "infera.io/role": role}
    annotations = {"infera.io/model": "Qwen/Qwen3-8B", "infera.io/port": "8000", **(notes or {})}
    return make_pod(name, ip=ip, ready=ready, labels=labels, annotations=annotations)


def k8s(api: StandinApiServer, **kw: Any) -> KubernetesDiscovery:
    values: dict[str, Any] = {"k8s_api_server": api.url, "k8s_namespace": "default", "k8s_retry_max": 0.2}
    values.update(kw)
    return KubernetesDiscovery(KubernetesSettings(**values), connect_timeout=2.0)


async def changes(stream: AsyncIterator[FleetChange], n: int, within: float = 10.0) -> list[tuple[str, str]]:
    out = []
    async with asyncio.timeout(within):
        for _ in range(n):
            change = await anext(stream)
            out.append((change.kind.value, change.worker_id))
    return out


@pytest.fixture
async def api() -> AsyncIterator[StandinApiServer]:
    async with StandinApiServer() as server:
        yield server


async def test_pod_labels_and_annotations_make_the_record(api: StandinApiServer) -> None:
    await api.put_pod(
        worker_pod(
            "prefill-0",
            ip="10.1.2.3",
            role="prefill",
            notes={
                "infera.io/dp-rank": "1",
                "infera.io/dp-size": "2",
                "infera.io/kv-events-port": "5557",
                "infera.io/kv-block-size": "16",
                "infera.io/kv-events-replay-port": "5558",
                "infera.io/pd-protocol": "vllm-nixl",
                "infera.io/pd-params": '{"side_channel_port": 5600}',
            },
        )
    )
    await api.put_pod(make_pod("not-a-worker", labels={"app": "other"}))
    discovery = k8s(api)
    await discovery.start()
    try:
        [record] = await discovery.list_workers()
    finally:
        await discovery.close()
    assert record.worker_id == "prefill-0" and record.url == "http://10.1.2.3:8000"
    assert (record.model, record.engine, record.role) == ("Qwen/Qwen3-8B", "vllm", Role.PREFILL)
    assert (record.dp_rank, record.dp_size, record.status) == (1, 2, Status.ACTIVE)
    assert record.kv_events is not None and record.kv_events.endpoint == "tcp://10.1.2.3:5557"
    assert record.kv_events.replay_endpoint == "tcp://10.1.2.3:5558"
    assert (record.kv_events.format, record.kv_events.block_size) == ("vllm", 16)
    assert record.pd is not None and record.pd.params == {"side_channel_port": 5600}
    assert record.labels["node"] == "node-1"
    assert api.requests[0]["labelSelector"] == "app.kubernetes.io/component=infera-worker"


async def test_statefulset_pod_index_is_the_dp_rank(api: StandinApiServer) -> None:
    pod = worker_pod("vllm-3", notes={"infera.io/dp-rank": "pod-index"})
    pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"] = "3"
    await api.put_pod(pod)
    discovery = k8s(api)
    await discovery.start()
    try:
        assert [r.dp_rank for r in await discovery.list_workers()] == [3]
    finally:
        await discovery.close()


async def test_watch_follows_readiness_termination_and_deletion(api: StandinApiServer) -> None:
    await api.put_pod(worker_pod("w0"))
    await api.put_pod(worker_pod("starting", ready=False))
    discovery = k8s(api)
    await discovery.start()
    stream = discovery.watch(sync_marker=True)
    try:
        assert await changes(stream, 2) == [("put", "w0"), ("synced", "")]  # only Ready pods
        await api.put_pod(worker_pod("starting", ready=True))
        assert await changes(stream, 1) == [("put", "starting")]
        await api.put_pod(worker_pod("starting", ready=False))  # readiness lost: out of rotation
        assert await changes(stream, 1) == [("delete", "starting")]
        terminating = worker_pod("w0", ready=False)
        terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
        await api.put_pod(terminating)
        change = await anext(stream)
        assert change.kind is ChangeKind.PUT and change.record is not None
        assert change.record.status is Status.DRAINING  # in-flight requests may finish
        await api.delete_pod("w0")
        assert await changes(stream, 1) == [("delete", "w0")]
        relabelled = worker_pod("moved")
        await api.put_pod(relabelled)
        assert await changes(stream, 1) == [("put", "moved")]
        relabelled["metadata"]["labels"]["app.kubernetes.io/component"] = "retired"
        await api.put_pod(relabelled)  # leaves the selector: the watch says DELETED
        assert await changes(stream, 1) == [("delete", "moved")]
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
        await discovery.close()
    watches = [q for q in api.requests if q.get("watch") == "true"]
    assert watches[0]["resourceVersion"] not in ("", "0")  # from the list's snapshot, no replay


@pytest.mark.parametrize("gone_as_http", [False, True], ids=["error-event", "http-410"])
async def test_410_gone_relists_and_sees_what_changed_meanwhile(gone_as_http: bool) -> None:
    async with StandinApiServer(bookmark_interval=60, gone_as_http=gone_as_http) as api:
        await api.put_pod(worker_pod("stays"))
        await api.put_pod(worker_pod("goes"))
        discovery = k8s(api)
        await discovery.start()
        stream = discovery.watch(sync_marker=True)
        try:
            assert sorted(await changes(stream, 3)) == [("put", "goes"), ("put", "stays"), ("synced", "")]
            lists = sum("watch" not in q for q in api.requests)
            # while the watch is cut (and reconnects fail): a deletion, an addition, compaction
            api.fail_next = 1000
            await api.drop_watches()
            await api.delete_pod("goes")
            await api.put_pod(worker_pod("new"))
            await api.compact()
            api.fail_next = 0
            seen = await changes(stream, 3)
            assert seen[-1] == ("synced", "")
            assert sorted(seen[:-1]) == [("delete", "goes"), ("put", "new")]
            assert sum("watch" not in q for q in api.requests) > lists  # it listed again
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
            await discovery.close()


async def test_bookmarks_let_a_cut_watch_resume_without_a_relist() -> None:
    async with StandinApiServer(bookmark_interval=0.05) as api:
        await api.put_pod(worker_pod("w0"))
        discovery = k8s(api)
        await discovery.start()
        stream = discovery.watch(sync_marker=True)
        try:
            assert await changes(stream, 2) == [("put", "w0"), ("synced", "")]
            for i in range(3):  # other pods move the resourceVersion on
                await api.put_pod(make_pod(f"other-{i}", labels={"app": "other"}))
            newest = api.version
            pending = asyncio.ensure_future(anext(stream))
            async with asyncio.timeout(15):
                while not any(q.get("watch") and int(q["resourceVersion"]) >= newest for q in api.requests):
                    await api.drop_watches()  # the client resumes from the last bookmark it saw
                    await asyncio.sleep(0.1)
            await api.compact()  # a resume from the list's version would now be 410 Gone
            await api.drop_watches()
            await api.put_pod(worker_pod("w1"))
            change = await asyncio.wait_for(pending, 15)
            assert (change.kind, change.worker_id) == (ChangeKind.PUT, "w1")
            assert sum("watch" not in q for q in api.requests) == 2  # start() + the first list only
            assert all(q.get("allowWatchBookmarks") == "true" for q in api.requests if q.get("watch"))
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
            await discovery.close()


async def test_events_torn_across_chunks_are_joined(api: StandinApiServer) -> None:
    api.split_events = True
    discovery = k8s(api)
    await discovery.start()
    stream = discovery.watch(sync_marker=True)
    try:
        assert await changes(stream, 1) == [("synced", "")]
        await api.put_pod(worker_pod("w0"))
        await api.put_pod(worker_pod("w1", ip="10.0.0.2"))
        assert await changes(stream, 2) == [("put", "w0"), ("put", "w1")]
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
        await discovery.close()


async def test_list_pages_with_continue_and_watch_renews_after_timeout_seconds(api: StandinApiServer) -> None:
    for i in range(5):
        await api.put_pod(worker_pod(f"w{i}", ip=f"10.0.0.{i + 1}"))
    discovery = k8s(api, k8s_page_size=2, k8s_watch_timeout=1)
    await discovery.start()
    stream = discovery.watch()
    try:
        assert sorted(await changes(stream, 5)) == [("put", f"w{i}") for i in range(5)]
        assert any("continue" in q for q in api.requests)
        pending = asyncio.ensure_future(anext(stream))  # the watch ends after timeoutSeconds=1…
        await until(lambda: sum(q.get("watch") == "true" for q in api.requests) >= 2, within=10)  # renewed
        await api.put_pod(worker_pod("late"))
        change = await asyncio.wait_for(pending, 15)
        assert (change.kind, change.worker_id) == (ChangeKind.PUT, "late")
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
        await discovery.close()


async def test_api_errors_are_retried_and_bad_pods_skipped(
    api: StandinApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    await api.put_pod(worker_pod("good"))
    await api.put_pod(worker_pod("bad", notes={"infera.io/port": "eighty"}))
    discovery = k8s(api)
    await discovery.start()
    api.fail_next = 3
    stream = discovery.watch(sync_marker=True)
    try:
        with caplog.at_level(logging.WARNING, "infera.discovery.kubernetes"):
            assert await changes(stream, 2) == [("put", "good"), ("synced", "")]
        assert "skipping pod bad: infera.io/port: expected an integer" in caplog.text
        assert "HTTP 500" in caplog.text
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
        await discovery.close()


async def test_unreachable_api_server_is_one_clear_error() -> None:
    settings = KubernetesSettings(k8s_api_server=f"http://127.0.0.1:{free_port()}", k8s_namespace="infera")
    discovery = KubernetesDiscovery(settings, connect_timeout=1.0)
    with pytest.raises(DiscoveryError, match=r"cannot list pods in namespace 'infera'.*get/list/watch"):
        await discovery.start()


async def test_worker_registration_is_a_ready_file(tmp_path: Path, api: StandinApiServer) -> None:
    ready = tmp_path / "state" / "ready"
    discovery = k8s(api, k8s_ready_file=str(ready))
    await discovery.start()
    try:
        reg = await discovery.register(contract_record("vllm-0"))
        assert ready.read_text() == "vllm-0\n"  # readiness probe: test -f
        await reg.update(contract_record("vllm-0", status="draining"))
        assert not ready.exists()  # draining: the pod leaves the routers' rotation
        await reg.update(contract_record("vllm-0"))
        assert ready.exists()
        await reg.deregister()
        await reg.deregister()
        assert not ready.exists()
    finally:
        await discovery.close()


def test_stand_in_selector_grammar() -> None:
    labels = {"a": "1", "b": "2"}
    assert label_matches("a=1,b==2", labels) and label_matches("a,!c", labels)
    assert label_matches("a in (1,3),b notin (3)", labels) and not label_matches("a!=1", labels)

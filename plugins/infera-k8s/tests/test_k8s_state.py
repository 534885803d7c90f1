"""Routers' shared records (API-key budgets) as ConfigMaps, through the real backend over HTTP
against the stand-in API server's resourceVersion preconditions (:mod:`infera_k8s.state`)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import httpx
import pytest
from infera_k8s.discovery import KubernetesDiscovery
from infera_k8s.settings import KubernetesSettings
from infera_k8s.state import configmap_name
from infera_k8s.testing import StandinApiServer

from infera_core.discovery.base import SharedState
from infera_core.errors import DiscoveryError


@pytest.fixture
async def api() -> AsyncIterator[StandinApiServer]:
    async with StandinApiServer() as server:
        yield server


@pytest.fixture
async def router(api: StandinApiServer) -> AsyncIterator[KubernetesDiscovery]:
    settings = KubernetesSettings(k8s_api_server=api.url, k8s_namespace="infera", k8s_ready_file="")
    discovery = KubernetesDiscovery(settings, connect_timeout=2.0)
    await discovery.start()
    yield discovery
    await discovery.close()


async def test_a_record_is_a_labelled_configmap_written_under_its_resource_version(
    api: StandinApiServer, router: KubernetesDiscovery
) -> None:
    assert isinstance(router, SharedState) and router.state_source == "kubernetes"
    assert await router.state_swap("budgets.ab12.rate", b'{"level": 3}', 0)
    stored = api.configmaps.objects[("infera", "infera-state.budgets.ab12.rate")]
    meta = stored["metadata"]
    assert meta["labels"] == {"app.kubernetes.io/managed-by": "infera", "infera.io/state": "true"}
    assert meta["annotations"] == {"infera.io/state-name": "budgets.ab12.rate"}
    assert stored["data"] == {"value": '{"level": 3}'}  # readable with kubectl
    value, revision = await router.state_get("budgets.ab12.rate")
    assert (value, revision) == (b'{"level": 3}', int(meta["resourceVersion"]))
    # the API server's own answers to the two races the backend reads as "lost"
    path = f"{api.url}/api/v1/namespaces/infera/configmaps"
    async with httpx.AsyncClient() as client:
        again = await client.post(path, json={"metadata": {"name": meta["name"]}, "data": {}})
        assert (again.status_code, again.json()["reason"]) == (409, "AlreadyExists")
        assert await router.state_swap("budgets.ab12.rate", b'{"level": 2}', revision)
        stale = {**stored, "metadata": {**meta, "resourceVersion": str(revision)}}
        conflict = await client.put(f"{path}/{meta['name']}", json=stale)
        assert (conflict.status_code, conflict.json()["reason"]) == (409, "Conflict")
    assert not await router.state_swap("budgets.ab12.rate", b'{"level": 1}', revision)  # stale
    value, newer = await router.state_get("budgets.ab12.rate")
    assert value == b'{"level": 2}' and newer > revision
    # a record deleted behind the router's back: its update loses, it is created again
    del api.configmaps.objects[("infera", meta["name"])]
    assert not await router.state_swap("budgets.ab12.rate", b"{}", newer)
    assert await router.state_get("budgets.ab12.rate") == (None, 0)


async def test_any_record_name_and_value_round_trip(
    api: StandinApiServer, router: KubernetesDiscovery
) -> None:
    name = "Budgets_Team.A" + "x" * 300  # upper case, '_' and too long for an object name
    assert configmap_name(name).startswith("infera-state.") and len(configmap_name(name)) <= 253
    assert configmap_name(name) != configmap_name(name.lower())
    assert await router.state_swap(name, b"\xff\x00raw", 0)
    (stored,) = api.configmaps.objects.values()
    assert stored["binaryData"] == {"value": base64.b64encode(b"\xff\x00raw").decode()}
    assert (await router.state_get(name))[0] == b"\xff\x00raw"


async def test_a_missing_permission_or_an_outage_raises_a_clear_error(
    api: StandinApiServer, router: KubernetesDiscovery
) -> None:
    api.configmaps.forbidden = True
    with pytest.raises(DiscoveryError, match="get, create and update on configmaps"):
        await router.state_get("budgets.participants")
    with pytest.raises(DiscoveryError, match="HTTP 403"):
        await router.state_swap("budgets.participants", b"{}", 0)
    api.configmaps.forbidden = False
    api.set_down(True)  # the store lost: any exception (global budgets degrade to a local share)
    with pytest.raises(Exception, match="503"):
        await router.state_get("budgets.participants")

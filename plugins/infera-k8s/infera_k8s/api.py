"""List and watch pods over the Kubernetes API (the protocol client-go's reflector follows).

* **list** ``GET /api/v1/namespaces/<ns>/pods?labelSelector=…&limit=N`` page by page
  (``continue``); the first page's ``metadata.resourceVersion`` is the snapshot's version.
* **watch** ``…/pods?watch=true&resourceVersion=RV&allowWatchBookmarks=true&timeoutSeconds=T``:
  a chunked stream of one JSON event per line (``ADDED``, ``MODIFIED``, ``DELETED``,
  ``BOOKMARK``, ``ERROR``). Every event moves RV forward; a stream the server ends
  (``timeoutSeconds``) is resumed from RV.
* **410 Gone** (an ``ERROR`` event with code 410, or the HTTP status, also for an expired
  ``continue`` token): RV was compacted away, so the caller must list again (:class:`Gone`).

Connection and authentication come from lightkube's configuration (in-cluster service
account with token rotation, ``KUBECONFIG``/``~/.kube/config`` with client certificates and
exec plugins, or a plain server URL); the list/watch loop is written here so that the
resourceVersion, bookmarks and resync rules are exactly the ones above.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx
from lightkube.config.client_adapter import AsyncClient, ConnectionParams
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.core.exceptions import ConfigError as LightkubeConfigError

from infera_core.errors import DiscoveryError


class Gone(Exception):
    """The resourceVersion (or ``continue`` token) is too old: list again."""


class ApiError(Exception):
    """The API server answered with an error other than 410 (status, message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str
    """ADDED, MODIFIED, DELETED or BOOKMARK."""
    object: dict[str, Any]


def load_config(api_server: str | None, kubeconfig: str | None) -> tuple[KubeConfig, str]:
    """(lightkube config, its namespace): an explicit server URL, a kubeconfig file, or the
    environment (in-cluster service account, then ``KUBECONFIG``, then ``~/.kube/config``)."""
    try:
        if api_server:
            config = KubeConfig.from_one(cluster=Cluster(server=api_server), user=User())
        elif kubeconfig:
            config = KubeConfig.from_file(kubeconfig)
        else:
            config = KubeConfig.from_env()
        single = config.get()
    except (LightkubeConfigError, OSError, KeyError) as exc:
        raise DiscoveryError(
            f"kubernetes discovery: no cluster configuration ({exc}); run in a pod with a service "
            "account, set KUBECONFIG, or pass INFERA_K8S_API_SERVER"
        ) from None
    if single is None:
        raise DiscoveryError("kubernetes discovery: the kubeconfig has no current context")
    return config, single.namespace


def status_message(body: bytes) -> str:
    """The ``message`` (else ``reason``) of an API server's ``Status`` body."""
    try:
        data = json.loads(body)
        return str(data.get("message") or data.get("reason") or body[:200].decode(errors="replace"))
    except ValueError:
        return body[:200].decode(errors="replace")


class PodApi:
    """Pods of one namespace matching one label selector."""

    def __init__(
        self,
        config: KubeConfig,
        namespace: str,
        selector: str,
        *,
        connect_timeout: float = 5.0,
        page_size: int = 500,
        watch_timeout: int = 300,
    ) -> None:
        single = config.get()
        assert single is not None
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.selector = selector
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        timeout = httpx.Timeout(connect_timeout, read=connect_timeout + 30)
        self._client = AsyncClient(single, ConnectionParams(timeout=timeout, trust_env=False))
        self._watch_read = float(watch_timeout + 30)

    @property
    def client(self) -> httpx.AsyncClient:
        """The authenticated HTTP client (also used for the shared-state ConfigMaps)."""
        return self._client

    async def close(self) -> None:
        await self._client.aclose()

    async def list(self) -> tuple[str, list[dict[str, Any]]]:
        """(resourceVersion, pods): every page of the list, as one snapshot."""
        items: list[dict[str, Any]] = []
        params: dict[str, str | int] = {"labelSelector": self.selector, "limit": self.page_size}
        version = ""
        while True:
            resp = await self._client.get(self.path, params=params)
            if resp.status_code == 410:
                raise Gone(status_message(resp.content))
            if resp.status_code != 200:
                raise ApiError(resp.status_code, status_message(resp.content))
            data = resp.json()
            meta = data.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            items.extend(i for i in data.get("items") or [] if isinstance(i, dict))
            token = meta.get("continue")
            if not token:
                return version, items
            params = {"labelSelector": self.selector, "limit": self.page_size, "continue": token}

    async def get(self, name: str) -> dict[str, Any] | None:
        """The pod called ``name`` (None when it does not exist)."""
        resp = await self._client.get(f"{self.path}/{name}")
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise ApiError(resp.status_code, status_message(resp.content))
        data: dict[str, Any] = resp.json()
        return data

    async def annotate(self, name: str, annotations: dict[str, str | None]) -> None:
        """Set (or, with None, remove) annotations of pod ``name`` (a JSON merge patch)."""
        resp = await self._client.patch(
            f"{self.path}/{name}",
            content=json.dumps({"metadata": {"annotations": annotations}}).encode(),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if resp.status_code != 200:
            raise ApiError(resp.status_code, status_message(resp.content))

    async def watch(self, version: str) -> AsyncIterator[WatchEvent]:
        """Events after ``version`` until the server ends the stream; raises :class:`Gone`."""
        params: dict[str, str | int] = {
            "watch": "true",
            "labelSelector": self.selector,
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": self.watch_timeout,
        }
        timeout = httpx.Timeout(self._client.timeout.connect, read=self._watch_read)
        async with self._client.stream("GET", self.path, params=params, timeout=timeout) as resp:
            if resp.status_code != 200:
                body = await resp.aread()
                if resp.status_code == 410:
                    raise Gone(status_message(body))
                raise ApiError(resp.status_code, status_message(body))
            async for line in resp.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone(str(obj.get("message") or "resourceVersion expired"))
                    raise ApiError(int(obj.get("code") or 500), str(obj.get("message") or obj))
                yield WatchEvent(str(kind), obj)

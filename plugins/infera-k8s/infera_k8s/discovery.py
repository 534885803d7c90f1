"""The ``kubernetes`` discovery backend: workers are the Ready pods a label selector picks.

Router side (``infera-run serve --discovery kubernetes``): list the worker pods, then
watch them from the list's resourceVersion (bookmarks on); a ``410 Gone`` lists again and
hands watchers only the differences (a ``SYNCED`` marker follows each full list). Records
come from the pods' labels and annotations (:mod:`infera_k8s.pods`), so workers need no
etcd: Kubernetes is the registry, the pod's ``Ready`` condition the heartbeat.

Worker side (``infera-run worker <engine> --discovery kubernetes``): the pod *is* the
registration, so :meth:`KubernetesDiscovery.register` writes nothing to the API server.
It keeps a ready file (``INFERA_K8S_READY_FILE``) that exists while the worker is
registered and active; the pod's readiness probe (``test -f``) turns that into the
``Ready`` condition the routers read — readiness = registered, draining = not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2 as httpx

from infera_core.discovery.base import DiscoverySettings, FleetChange, Registration
from infera_core.discovery.records import SYNCED, diff
from infera_core.errors import DiscoveryError
from infera_core.worker import WorkerRecord
from infera_k8s.api import ApiError, Gone, PodApi, load_config
from infera_k8s.pods import pod_name, record_or_none, resource_version
from infera_k8s.settings import KubernetesSettings

log = logging.getLogger("infera.discovery.kubernetes")

RETRY_FIRST = 0.2
TRANSIENT = (ApiError, httpx.HTTPError, OSError, ValueError)
"""What a list or watch may fail with and be retried (ValueError: a torn JSON line)."""


class PodRegistration:
    """The worker side: a ready file that exists while the record is active."""

    def __init__(self, ready_file: Path | None, record: WorkerRecord) -> None:
        self.ready_file = ready_file
        self._apply(record)

    def _apply(self, record: WorkerRecord | None) -> None:
        if self.ready_file is None:
            return
        if record is not None and record.routable:
            self.ready_file.parent.mkdir(parents=True, exist_ok=True)
            self.ready_file.write_text(record.worker_id + "\n")
        else:
            self.ready_file.unlink(missing_ok=True)

    async def update(self, record: WorkerRecord) -> None:
        self._apply(record)

    async def deregister(self) -> None:
        self._apply(None)


class KubernetesDiscovery:
    """Read worker pods from the Kubernetes API (see the module docstring)."""

    def __init__(self, settings: KubernetesSettings, connect_timeout: float = 5.0) -> None:
        self.settings = settings
        self.connect_timeout = connect_timeout
        self._api: PodApi | None = None
        self._closed = asyncio.Event()

    async def start(self) -> None:
        self._closed.clear()
        s = self.settings
        config, namespace = load_config(s.k8s_api_server, s.k8s_kubeconfig)
        self.namespace = s.k8s_namespace or namespace
        self._api = PodApi(
            config,
            self.namespace,
            s.k8s_selector,
            connect_timeout=self.connect_timeout,
            page_size=s.k8s_page_size,
            watch_timeout=s.k8s_watch_timeout,
        )
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self._api.list()
        except (TimeoutError, Gone, *TRANSIENT) as exc:
            await self.close()
            raise DiscoveryError(
                f"kubernetes discovery: cannot list pods in namespace {self.namespace!r} "
                f"({type(exc).__name__}: {exc}); the service account needs get/list/watch on pods "
                "(deploy/kubernetes/base/rbac.yaml)"
            ) from None

    async def close(self) -> None:
        self._closed.set()
        if self._api is not None:
            api, self._api = self._api, None
            await api.close()

    async def register(self, record: WorkerRecord) -> Registration:
        ready = Path(self.settings.k8s_ready_file) if self.settings.k8s_ready_file else None
        log.info(
            "worker %s: the routers read it from its pod's labels; ready file %s",
            record.worker_id,
            ready or "(none)",
        )
        return PodRegistration(ready, record)

    def _require_api(self) -> PodApi:
        if self._api is None:
            raise DiscoveryError("kubernetes discovery: not started (or closed)")
        return self._api

    async def list_workers(self) -> list[WorkerRecord]:
        _, pods = await self._require_api().list()
        records = (record_or_none(p) for p in pods)
        return sorted((r for r in records if r is not None), key=lambda r: r.worker_id)

    async def _pause(self, delay: float) -> float:
        """Sleep ``delay`` (or until closed); return the next, doubled delay."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closed.wait(), delay)
        return min(delay * 2, self.settings.k8s_retry_max)

    async def watch(self, *, sync_marker: bool = False) -> AsyncIterator[FleetChange]:
        known: dict[str, WorkerRecord] = {}
        delay = RETRY_FIRST
        while not self._closed.is_set():
            try:
                version, pods = await self._require_api().list()
            except (Gone, *TRANSIENT) as exc:
                if self._closed.is_set():
                    return
                log.warning("kubernetes discovery: listing pods failed (%s); retrying in %.1fs", exc, delay)
                delay = await self._pause(delay)
                continue
            fresh = {pod_name(p): r for p in pods if (r := record_or_none(p)) is not None}
            for change in diff(known, fresh):
                yield change
            if sync_marker:
                yield SYNCED
            delay = RETRY_FIRST
            async for change in self._follow(version, known):
                yield change

    async def _follow(self, version: str, known: dict[str, WorkerRecord]) -> AsyncIterator[FleetChange]:
        """Watch from ``version`` (renewing the watch as the server ends it) until 410 Gone."""
        delay = RETRY_FIRST
        while not self._closed.is_set():
            try:
                async for event in self._require_api().watch(version):
                    version = resource_version(event.object) or version
                    delay = RETRY_FIRST
                    if event.type == "BOOKMARK":
                        continue
                    name = pod_name(event.object)
                    record = None if event.type == "DELETED" else record_or_none(event.object)
                    before = known.pop(name, None)
                    view = {name: before} if before is not None else {}
                    changes = diff(view, {name: record} if record is not None else {})
                    known.update(view)  # diff turned the view into the pod's current state
                    for change in changes:
                        yield change
            except Gone as exc:
                log.info("kubernetes discovery: resourceVersion %s expired (%s); listing again", version, exc)
                return
            except (*TRANSIENT, DiscoveryError) as exc:
                if self._closed.is_set():
                    return
                log.warning("kubernetes discovery: watch failed (%s); resuming in %.1fs", exc, delay)
                delay = await self._pause(delay)


class KubernetesDiscoveryFactory:
    name = "kubernetes"
    description = "Worker pods picked by a label selector (list + watch; --k8s-* flags); read-only."
    settings_model = KubernetesSettings

    def create(self, settings: DiscoverySettings) -> KubernetesDiscovery:
        options = getattr(settings, "options", None)  # the backend settings seam (flags + env)
        own = options.get(KubernetesSettings) if options is not None else KubernetesSettings()
        return KubernetesDiscovery(own, settings.connect_timeout)

"""The ``kubernetes`` discovery backend: workers are the Ready pods a label selector picks.

Router side (``infera-run serve --discovery kubernetes``): list the worker pods, then
watch them from the list's resourceVersion (bookmarks on); a ``410 Gone`` lists again and
hands watchers only the differences (a ``SYNCED`` marker follows each full list). Records
come from the pods' labels and annotations (:mod:`infera_k8s.pods`), so workers need no
etcd: Kubernetes is the registry, the pod's ``Ready`` condition the heartbeat.

Worker side (``infera-run worker <engine> --discovery-backend kubernetes``): the pod is
the registration. With ``INFERA_K8S_POD_NAME`` set, :meth:`KubernetesDiscovery.register`
publishes the launcher's whole record as the pod's ``infera.io/worker-record`` annotation
(updated on drain, removed on deregistration); without it the router builds the record
from the pod's labels/annotations. Either way a ready file (``INFERA_K8S_READY_FILE``)
exists while the worker is registered and active; the pod's readiness probe (``test -f``)
turns that into the ``Ready`` condition the routers read — readiness = registered,
draining = not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2 as httpx

from infera_core.discovery.base import FleetChange, Registration
from infera_core.discovery.records import SYNCED, diff
from infera_core.errors import DiscoveryError
from infera_core.worker import WorkerRecord
from infera_k8s.api import ApiError, Gone, PodApi, load_config
from infera_k8s.pods import RECORD_ANNOTATION, pod_name, record_or_none, resource_version
from infera_k8s.settings import KubernetesSettings
from infera_k8s.state import ConfigMapState

log = logging.getLogger("infera.discovery.kubernetes")

RETRY_FIRST = 0.2
PUBLISH_RETRY = 20.0
"""How long a worker retries publishing a drain or a deregistration while the API server
is unreachable (a pod deleted meanwhile takes its record with it anyway)."""
TRANSIENT = (ApiError, httpx.HTTPError, OSError, ValueError)
"""What a list or watch may fail with and be retried (ValueError: a torn JSON line)."""


class PodRegistration:
    """The worker side: the pod's record annotation (when the pod is named) and a ready
    file, both following the record; deregistering removes both."""

    def __init__(self, api: PodApi | None, pod: str | None, ready_file: Path | None) -> None:
        self.api, self.pod, self.ready_file = api, pod, ready_file
        self._registered = True

    async def publish(self, record: WorkerRecord | None, retry_for: float = PUBLISH_RETRY) -> None:
        """Write ``record`` (None: remove it), retrying an unreachable API server for ``retry_for`` s."""
        if self.api is not None and self.pod is not None:
            value = record.to_json().decode() if record else None
            loop = asyncio.get_running_loop()
            deadline, delay = loop.time() + retry_for, RETRY_FIRST
            while True:
                try:
                    await self.api.annotate(self.pod, {RECORD_ANNOTATION: value})
                    break
                except TRANSIENT as exc:
                    if loop.time() + delay > deadline:
                        raise
                    log.warning(
                        "kubernetes discovery: annotating pod %s failed (%s); retrying", self.pod, exc
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
        if self.ready_file is None:
            return
        if record is not None and record.routable:
            self.ready_file.parent.mkdir(parents=True, exist_ok=True)
            self.ready_file.write_text(record.worker_id + "\n")
        else:
            self.ready_file.unlink(missing_ok=True)

    async def update(self, record: WorkerRecord) -> None:
        if self._registered:
            await self.publish(record)

    async def deregister(self) -> None:
        if self._registered:
            self._registered = False
            if self.ready_file is not None:
                self.ready_file.unlink(missing_ok=True)
            await self.publish(None)


class KubernetesDiscovery:
    """Read worker pods from the Kubernetes API (see the module docstring); keep the routers'
    shared records (API-key budgets) as ConfigMaps (:mod:`infera_k8s.state`)."""

    state_source = "kubernetes"

    def __init__(self, settings: KubernetesSettings, connect_timeout: float = 5.0) -> None:
        self.settings = settings
        self.connect_timeout = connect_timeout
        self._api: PodApi | None = None
        self._state: ConfigMapState | None = None
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
        self._state = ConfigMapState(self._api.client, self.namespace)
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
            api, self._api, self._state = self._api, None, None
            await api.close()

    async def register(self, record: WorkerRecord) -> Registration:
        s = self.settings
        ready = Path(s.k8s_ready_file) if s.k8s_ready_file else None
        pod = s.k8s_pod_name
        if pod:
            await self._check_pod(pod, record)
        log.info(
            "worker %s: published %s; ready file %s",
            record.worker_id,
            f"as pod {pod}'s {RECORD_ANNOTATION} annotation" if pod else "by its pod's labels/annotations",
            ready or "(none)",
        )
        registration = PodRegistration(self._api if pod else None, pod, ready)
        try:
            await registration.publish(record, retry_for=0)
        except TRANSIENT as exc:
            raise DiscoveryError(
                f"kubernetes discovery: cannot annotate pod {pod} ({exc}); the worker's service "
                "account needs patch on pods (deploy/kubernetes/base/rbac.yaml)"
            ) from None
        return registration

    async def _check_pod(self, pod: str, record: WorkerRecord) -> None:
        """The pod exists and carries no other worker's record (a restarted container
        advertising the same URL replaces its own)."""
        try:
            found = await self._require_api().get(pod)
        except TRANSIENT as exc:
            raise DiscoveryError(f"kubernetes discovery: cannot read pod {pod} ({exc})") from None
        if found is None:
            raise DiscoveryError(
                f"kubernetes discovery: no pod {pod!r} in namespace {self.namespace!r} "
                "(INFERA_K8S_POD_NAME should come from the downward API: metadata.name)"
            )
        published = ((found.get("metadata") or {}).get("annotations") or {}).get(RECORD_ANNOTATION)
        if published:
            try:
                current = WorkerRecord.from_json(published)
            except ValueError:
                return  # unreadable: ours replaces it
            if current.url != record.url:
                raise DiscoveryError(
                    f"worker {record.worker_id}: pod {pod} already carries the record of the worker "
                    f"at {current.url} (two workers cannot share a pod's registration)"
                )

    async def state_get(self, name: str) -> tuple[bytes | None, int]:
        return await self._require_state().get(name)

    async def state_swap(self, name: str, value: bytes, revision: int) -> bool:
        return await self._require_state().swap(name, value, revision)

    def _require_state(self) -> ConfigMapState:
        if self._state is None:
            raise DiscoveryError("kubernetes discovery: not started (or closed)")
        return self._state

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

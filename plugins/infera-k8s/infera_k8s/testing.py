"""A stand-in Kubernetes API server for pods: real HTTP on 127.0.0.1, the real list/watch protocol.

What it follows (api-concepts "Efficient detection of changes", KEP-956 watch bookmarks):

* one global, increasing ``resourceVersion``; every pod write bumps it and is kept in an
  event history; :meth:`StandinApiServer.compact` drops the history (as etcd compaction does);
* ``GET /api/v1/namespaces/<ns>/pods`` lists (``labelSelector``, ``limit``/``continue``;
  a ``continue`` token from before a compaction answers ``410 Gone``);
* ``?watch=true``: a chunked stream of JSON lines. ``resourceVersion`` unset or ``"0"``
  starts with synthetic ``ADDED`` events for the current pods; otherwise the history after
  it is replayed, or, when it was compacted away, one ``ERROR`` event with a 410 ``Status``
  (or an HTTP 410 with ``gone_as_http=True``, as an API server without watch cache answers).
  Under a label selector, a pod whose labels stop (start) matching arrives as ``DELETED``
  (``ADDED``), like the watch cache's filter. ``allowWatchBookmarks=true`` adds ``BOOKMARK``
  events (only ``metadata.resourceVersion``) every ``bookmark_interval`` seconds, and
  ``timeoutSeconds`` ends the stream cleanly.

``GET``/``PATCH`` ``…/pods/<name>`` read one pod and apply a JSON merge patch to it
(``application/merge-patch+json``; a MODIFIED event like any other write).

``GET``/``POST``/``PUT`` ``…/configmaps`` serve ConfigMaps with the API server's optimistic
concurrency (``409 AlreadyExists``, ``409 Conflict`` on a stale ``resourceVersion``; see
:mod:`infera_k8s.testing_configmaps`); ``set_down`` and ``fail_next`` apply to them too.

Test controls: :meth:`put_pod` / :meth:`delete_pod`, :meth:`compact`, :meth:`drop_watches`
(cut every open stream mid-way), :meth:`set_down` (an outage), ``fail_next`` (answer that many requests with a 500), and
``requests`` (the query of every request, for assertions). Needs ``aiohttp``.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from aiohttp import web

from infera_core.util.net import free_port
from infera_k8s.testing_configmaps import StandinConfigMaps, api_status

Pod = dict[str, Any]


def label_matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based selectors (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``) and ``k in (a,b)``."""
    for term in _split_terms(selector):
        if " in " in term or " notin " in term:
            key, op, rest = term.partition(" notin ") if " notin " in term else term.partition(" in ")
            values = {v.strip() for v in rest.strip().strip("()").split(",")}
            inside = labels.get(key.strip()) in values
            if inside != (op == " in "):
                return False
        elif "!=" in term:
            key, _, value = term.partition("!=")
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, _, value = term.replace("==", "=").partition("=")
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term.strip() not in labels:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    return [t for t in terms if t.strip()]


def make_pod(
    name: str,
    *,
    ip: str = "10.0.0.1",
    ready: bool = True,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    namespace: str = "default",
) -> Pod:
    """A Running pod as the API server would return it (without resourceVersion)."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": {"nodeName": "node-1", "containers": [{"name": "worker", "image": "infera"}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


class StandinApiServer:
    """Pods of any namespace behind the list/watch protocol (see the module docstring)."""

    def __init__(self, *, bookmark_interval: float = 0.2, gone_as_http: bool = False) -> None:
        self.bookmark_interval = bookmark_interval
        self.gone_as_http = gone_as_http
        self.version = 1
        self.pods: dict[tuple[str, str], Pod] = {}
        self.history: list[tuple[int, str, Pod, Pod | None]] = []
        """(resourceVersion, type, pod, the pod before this event)."""
        self.oldest = 1
        """Watches may start from ``oldest - 1`` or later; older is 410 Gone."""
        self.fail_next = 0
        self.down = False
        self.split_events = False
        """When True every watch event is written as two chunks (a torn line the client must join)."""
        """While True every request is answered 503 (see :meth:`set_down`)."""
        self.requests: list[dict[str, str]] = []
        self.configmaps = StandinConfigMaps(self._bump, self._refused)
        """ConfigMaps with resourceVersion preconditions (:mod:`infera_k8s.testing_configmaps`)."""
        self._changed = asyncio.Condition()
        self._streams: set[web.StreamResponse] = set()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- test controls ------------------------------------------------------------
    async def put_pod(self, pod: Pod) -> Pod:
        """Create or replace a pod (ADDED or MODIFIED); returns it with its resourceVersion."""
        pod = copy.deepcopy(pod)
        key = (pod["metadata"].get("namespace", "default"), pod["metadata"]["name"])
        before = self.pods.get(key)
        await self._record("MODIFIED" if before else "ADDED", key, pod, before)
        return pod

    async def delete_pod(self, name: str, namespace: str = "default") -> None:
        before = self.pods[(namespace, name)]
        await self._record("DELETED", (namespace, name), copy.deepcopy(before), before)

    async def compact(self) -> None:
        """Forget the event history: watches from an older resourceVersion get 410 Gone."""
        self.history.clear()
        self.oldest = self.version + 1

    async def drop_watches(self) -> None:
        """Cut every open watch stream (a load balancer or API server restart)."""
        self._cut_streams()

    def set_down(self, down: bool) -> None:
        """An outage: open watches are cut and every request is answered 503 until it ends
        (the pods are kept, as etcd keeps them behind a restarting API server)."""
        self.down = down
        if down:
            self._cut_streams()

    def _cut_streams(self) -> None:
        for stream in list(self._streams):
            transport = stream._req.transport if stream._req is not None else None
            if transport is not None:
                transport.close()

    def _bump(self) -> int:
        self.version += 1
        return self.version

    def _refused(self) -> web.Response | None:
        """An outage's 503 or an injected 500 (``fail_next``); None: serve the request."""
        if (outage := self._unavailable()) is not None:
            return outage
        if self.fail_next > 0:
            self.fail_next -= 1
            return web.json_response(self._status(500, "InternalError", "stand-in failure"), status=500)
        return None

    async def _record(self, kind: str, key: tuple[str, str], pod: Pod, before: Pod | None) -> None:
        async with self._changed:
            self.version += 1
            pod["metadata"]["resourceVersion"] = str(self.version)
            if kind == "DELETED":
                self.pods.pop(key, None)
            else:
                self.pods[key] = pod
            self.history.append((self.version, kind, pod, before))
            self._changed.notify_all()

    # -- server ---------------------------------------------------------------------
    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._pods)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get)
        app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}", self._patch)
        self.configmaps.add_routes(app)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def close(self) -> None:
        await self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> StandinApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @staticmethod
    def _status(code: int, reason: str, message: str) -> dict[str, Any]:
        return api_status(code, reason, message)

    def _selected(self, ns: str, selector: str) -> list[Pod]:
        return [
            p
            for (pns, _), p in sorted(self.pods.items())
            if pns == ns and label_matches(selector, p["metadata"].get("labels") or {})
        ]

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append(query)
        if (refused := self._refused()) is not None:
            return refused
        if query.get("watch") in ("true", "1"):
            return await self._watch(request, request.match_info["ns"], query)
        return self._list(request.match_info["ns"], query)

    def _not_found(self, ns: str, name: str) -> web.Response:
        return web.json_response(self._status(404, "NotFound", f'pods "{name}" not found'), status=404)

    def _unavailable(self) -> web.Response | None:
        if self.down:
            return web.json_response(self._status(503, "ServiceUnavailable", "stand-in outage"), status=503)
        return None

    async def _get(self, request: web.Request) -> web.Response:
        if (outage := self._unavailable()) is not None:
            return outage
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self.pods.get((ns, name))
        return web.json_response(pod) if pod is not None else self._not_found(ns, name)

    async def _patch(self, request: web.Request) -> web.Response:
        """JSON merge patch (RFC 7386: objects merge, null removes), the only kind served."""
        if (outage := self._unavailable()) is not None:
            return outage
        ns, name = request.match_info["ns"], request.match_info["name"]
        self.requests.append({"patch": name})
        if request.content_type != "application/merge-patch+json":
            message = f"unsupported patch type {request.content_type}"
            return web.json_response(self._status(415, "UnsupportedMediaType", message), status=415)
        before = self.pods.get((ns, name))
        if before is None:
            return self._not_found(ns, name)
        return web.json_response(await self.put_pod(merge_patch(copy.deepcopy(before), await request.json())))

    def _list(self, ns: str, query: dict[str, str]) -> web.Response:
        pods = self._selected(ns, query.get("labelSelector", ""))
        version, start = self.version, 0
        if "continue" in query:
            version, start = (int(x) for x in query["continue"].split(":"))
            if version < self.oldest - 1:
                return web.json_response(
                    self._status(410, "Expired", "The provided continue parameter is too old"), status=410
                )
            pods = [p for p in pods if int(p["metadata"]["resourceVersion"]) <= version]
        limit = int(query.get("limit") or 0) or len(pods) or 1
        page = pods[start : start + limit]
        meta: dict[str, Any] = {"resourceVersion": str(version)}
        if start + limit < len(pods):
            meta["continue"] = f"{version}:{start + limit}"
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page})

    async def _watch(self, request: web.Request, ns: str, query: dict[str, str]) -> web.StreamResponse:
        selector = query.get("labelSelector", "")
        since = query.get("resourceVersion", "")
        bookmarks = query.get("allowWatchBookmarks") == "true"
        timeout = float(query.get("timeoutSeconds") or 1800)
        if since not in ("", "0") and int(since) < self.oldest - 1 and self.gone_as_http:
            message = f"too old resource version: {since} ({self.oldest})"
            return web.json_response(self._status(410, "Expired", message), status=410)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        self._streams.add(resp)
        try:
            await self._stream(resp, ns, selector, since, bookmarks, timeout)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._streams.discard(resp)
        return resp

    async def _stream(
        self, resp: web.StreamResponse, ns: str, selector: str, since: str, bookmarks: bool, seconds: float
    ) -> None:
        async def send(kind: str, obj: dict[str, Any]) -> None:
            line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
            if self.split_events:  # one event across two HTTP chunks, as a proxy may cut it
                await resp.write(line[: len(line) // 2])
                await asyncio.sleep(0.01)
                line = line[len(line) // 2 :]
            await resp.write(line)

        if since in ("", "0"):
            for pod in self._selected(ns, selector):
                await send("ADDED", pod)
            sent = self.version
        elif int(since) < self.oldest - 1:
            await send(
                "ERROR", self._status(410, "Expired", f"too old resource version: {since} ({self.oldest})")
            )
            return
        else:
            sent = int(since)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while loop.time() < deadline:
            for version, kind, pod, before in [h for h in self.history if h[0] > sent]:
                sent = version
                if pod["metadata"].get("namespace", "default") != ns:
                    continue
                now = kind != "DELETED" and label_matches(selector, pod["metadata"].get("labels") or {})
                was = before is not None and label_matches(selector, before["metadata"].get("labels") or {})
                if now:
                    await send("MODIFIED" if was else "ADDED", pod)
                elif was:
                    await send("DELETED", pod)
            wait = (
                min(self.bookmark_interval, deadline - loop.time()) if bookmarks else deadline - loop.time()
            )
            async with self._changed:
                if self.history and self.history[-1][0] > sent:
                    continue  # written while we were sending
                try:
                    await asyncio.wait_for(self._changed.wait(), max(wait, 0.0))
                except TimeoutError:
                    if bookmarks and loop.time() < deadline:
                        bookmark = {
                            "kind": "Pod",
                            "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(sent)},
                        }
                        await send("BOOKMARK", bookmark)

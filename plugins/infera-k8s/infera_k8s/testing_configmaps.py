"""ConfigMaps for the stand-in API server (:class:`infera_k8s.testing.StandinApiServer`), with
the API server's optimistic concurrency (what :mod:`infera_k8s.state` relies on):

* ``GET …/configmaps/<name>``: the object, or ``404 NotFound``;
* ``POST …/configmaps``: ``201`` with a new ``resourceVersion``; ``409 AlreadyExists`` when
  the name is taken; ``422 Invalid`` for a name that is not a DNS subdomain or data over 1 MiB;
  ``400 BadRequest`` when the body's namespace is not the URL's;
* ``PUT …/configmaps/<name>``: ``404 NotFound`` when absent (ConfigMaps are not created by an
  update); ``409 Conflict`` ("the object has been modified") when the body's
  ``resourceVersion`` is not the stored one (an empty one updates unconditionally); an update
  that changes nothing answers ``200`` with the stored object and its unchanged version;
* ``forbidden = True``: ``403 Forbidden`` for every ConfigMap request (RBAC without the verbs).

ConfigMap writes take the server's one global ``resourceVersion`` (as etcd revisions are
shared by every kind) but are not sent to pod watches.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

MAX_BYTES = 1 << 20
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_CONTENT = ("data", "binaryData", "immutable")


def api_status(code: int, reason: str, message: str, name: str = "", kind: str = "") -> dict[str, Any]:
    """A ``Status`` failure body as the API server writes it."""
    out: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if name:
        out["details"] = {"name": name, "kind": kind}
    return out


def _fail(code: int, reason: str, message: str, name: str = "") -> web.Response:
    return web.json_response(api_status(code, reason, message, name, "configmaps"), status=code)


class StandinConfigMaps:
    """ConfigMaps of every namespace; ``bump()`` hands out the next global resourceVersion;
    ``gate()`` answers an outage or an injected failure (None: serve the request)."""

    def __init__(self, bump: Callable[[], int], gate: Callable[[], web.Response | None]) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.forbidden = False
        """While True every request is answered 403 (a service account without the RBAC verbs)."""
        self._bump, self._gate = bump, gate

    def _refused(self, request: web.Request, verb: str) -> web.Response | None:
        if self.forbidden:
            ns = request.match_info["ns"]
            message = (
                f'configmaps is forbidden: User "system:serviceaccount:{ns}:infera-router" cannot '
                f'{verb} resource "configmaps" in API group "" in the namespace "{ns}"'
            )
            return _fail(403, "Forbidden", message)
        return self._gate()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/api/v1/namespaces/{ns}/configmaps/{name}", self._get)
        app.router.add_post("/api/v1/namespaces/{ns}/configmaps", self._create)
        app.router.add_put("/api/v1/namespaces/{ns}/configmaps/{name}", self._update)

    async def _get(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request, "get")) is not None:
            return refused
        ns, name = request.match_info["ns"], request.match_info["name"]
        found = self.objects.get((ns, name))
        if found is None:
            return _fail(404, "NotFound", f'configmaps "{name}" not found', name)
        return web.json_response(found)

    async def _body(self, request: web.Request, verb: str) -> tuple[dict[str, Any], web.Response | None]:
        """The request's valid ConfigMap, or the answer that refuses it."""
        if (refused := self._refused(request, verb)) is not None:
            return {}, refused
        try:
            body = json.loads(await request.read())
        except ValueError as exc:
            return {}, _fail(400, "BadRequest", f"invalid JSON: {exc}")
        meta = body.get("metadata") if isinstance(body, dict) else None
        if not isinstance(meta, dict):
            return {}, _fail(400, "BadRequest", "metadata is required")
        name, ns = str(meta.get("name") or ""), request.match_info["ns"]
        if meta.get("namespace", ns) != ns:
            message = "the namespace of the provided object does not match the namespace sent on the request"
            return {}, _fail(400, "BadRequest", message)
        if not _SUBDOMAIN.fullmatch(name) or len(name) > 253:
            message = f'ConfigMap "{name}" is invalid: metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain'
            return {}, _fail(422, "Invalid", message, name)
        size = sum(
            len(k) + len(str(v)) for part in ("data", "binaryData") for k, v in (body.get(part) or {}).items()
        )
        if size > MAX_BYTES:
            return {}, _fail(
                422,
                "Invalid",
                f'ConfigMap "{name}" is invalid: []: Too long: must have at most {MAX_BYTES} bytes',
                name,
            )
        return body, None

    def _store(self, ns: str, body: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        meta["namespace"] = ns
        meta["uid"] = before["metadata"]["uid"] if before else f"uid-cm-{meta['name']}"
        meta["creationTimestamp"] = (
            before["metadata"]["creationTimestamp"] if before else "2026-01-01T00:00:00Z"
        )
        meta["resourceVersion"] = str(self._bump())
        obj.setdefault("apiVersion", "v1")
        obj.setdefault("kind", "ConfigMap")
        self.objects[(ns, meta["name"])] = obj
        return obj

    async def _create(self, request: web.Request) -> web.Response:
        body, bad = await self._body(request, "create")
        if bad is not None:
            return bad
        ns, name = request.match_info["ns"], body["metadata"]["name"]
        if body["metadata"].get("resourceVersion"):
            return _fail(500, "InternalError", "resourceVersion should not be set on objects to be created")
        if (ns, name) in self.objects:
            return _fail(409, "AlreadyExists", f'configmaps "{name}" already exists', name)
        return web.json_response(self._store(ns, body, None), status=201)

    async def _update(self, request: web.Request) -> web.Response:
        body, bad = await self._body(request, "update")
        if bad is not None:
            return bad
        ns, name = request.match_info["ns"], request.match_info["name"]
        if body["metadata"]["name"] != name:
            message = f"the name of the object ({body['metadata']['name']}) does not match the name on the URL ({name})"
            return _fail(400, "BadRequest", message)
        before = self.objects.get((ns, name))
        if before is None:
            return _fail(404, "NotFound", f'configmaps "{name}" not found', name)
        version = str(body["metadata"].get("resourceVersion") or "")
        if version and version != before["metadata"]["resourceVersion"]:
            message = (
                f'Operation cannot be fulfilled on configmaps "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again"
            )
            return _fail(409, "Conflict", message, name)
        same = all(body.get(k) == before.get(k) for k in _CONTENT) and all(
            body["metadata"].get(k) == before["metadata"].get(k) for k in ("labels", "annotations")
        )
        if same:  # the API server skips a write that changes nothing: the version stays
            return web.json_response(before)
        return web.json_response(self._store(ns, body, before))

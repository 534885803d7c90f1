"""Shared records on Kubernetes (:class:`~infera_core.discovery.base.SharedState`): one
ConfigMap per record, in the backend's namespace, written with optimistic concurrency on
``metadata.resourceVersion``.

* **name**: ``infera-state.<name>`` when the record's name is already a DNS subdomain
  (lowercase, dots between alphanumeric parts, as the budgets' ``budgets.<hex>.rate`` are),
  else ``infera-state.<sha256 of the name, 40 hex>``; the original name is kept in the
  ``infera.io/state-name`` annotation. Labelled ``app.kubernetes.io/managed-by: infera`` and
  ``infera.io/state: "true"`` (``kubectl get configmaps -l infera.io/state`` lists them).
* **value**: ``data.value`` when it is UTF-8 (the budgets' JSON), else ``binaryData.value``.
* **revision**: the ConfigMap's ``metadata.resourceVersion`` as an integer (an API server on
  etcd hands out etcd revisions; Kubernetes 1.35 made "a positive integer" the rule,
  KEP-5504). Absent: 0.
* **create** (revision 0): ``POST …/configmaps``; ``409 AlreadyExists``: another router came
  first. **update**: ``PUT …/configmaps/<name>`` naming the read ``resourceVersion``;
  ``409 Conflict`` (the object has been modified) or ``404 NotFound`` (deleted meanwhile):
  another writer came first. An update that changes nothing keeps the resourceVersion (the
  API server skips the write), which is still a correct compare-and-swap: the record is what
  it was.

No owner and no TTL: the records outlive the routers that wrote them (a few hundred bytes
per API key and record kind). The router's service account needs ``get``, ``create`` and
``update`` on ``configmaps`` in that namespace (``deploy/kubernetes/base/rbac.yaml``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

import httpx2 as httpx

from infera_core.errors import DiscoveryError
from infera_k8s.api import ApiError, status_message

PREFIX = "infera-state."
NAME_ANNOTATION = "infera.io/state-name"
LABELS = {"app.kubernetes.io/managed-by": "infera", "infera.io/state": "true"}
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_RBAC = (
    "the router's service account needs get, create and update on configmaps "
    "(deploy/kubernetes/base/rbac.yaml)"
)


def configmap_name(name: str) -> str:
    """The ConfigMap that holds record ``name`` (a valid, 253-character-at-most object name)."""
    full = PREFIX + name
    if _SUBDOMAIN.fullmatch(name) and len(full) <= 253:
        return full
    return PREFIX + hashlib.sha256(name.encode()).hexdigest()[:40]


def revision_of(obj: dict[str, Any]) -> int:
    """``metadata.resourceVersion`` as the integer it is on an etcd-backed API server."""
    version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    if not version.isdigit() or int(version) <= 0:
        raise DiscoveryError(
            f"kubernetes shared state: resourceVersion {version!r} is not a positive integer; "
            "budgets cannot be shared through this API server (use etcd or the NATS plane)"
        )
    return int(version)


def value_of(obj: dict[str, Any]) -> bytes:
    data, binary = obj.get("data") or {}, obj.get("binaryData") or {}
    if "value" in data:
        return str(data["value"]).encode()
    return base64.b64decode(binary.get("value") or "")


class ConfigMapState:
    """Get and compare-and-swap records as ConfigMaps of one namespace."""

    def __init__(self, client: httpx.AsyncClient, namespace: str) -> None:
        self._client = client
        self.namespace = namespace
        self.path = f"/api/v1/namespaces/{namespace}/configmaps"

    def _body(self, name: str, value: bytes, revision: int) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": configmap_name(name),
            "namespace": self.namespace,
            "labels": LABELS,
            "annotations": {NAME_ANNOTATION: name},
        }
        if revision:
            meta["resourceVersion"] = str(revision)
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
        try:
            body["data"] = {"value": value.decode()}
        except UnicodeDecodeError:
            body["binaryData"] = {"value": base64.b64encode(value).decode()}
        return body

    def _error(self, status: int, content: bytes, name: str) -> Exception:
        message = status_message(content)
        if status in (401, 403):
            return DiscoveryError(
                f"kubernetes shared state: configmap {configmap_name(name)} in namespace "
                f"{self.namespace!r}: HTTP {status} ({message}); {_RBAC}"
            )
        return ApiError(status, message)

    async def get(self, name: str) -> tuple[bytes | None, int]:
        resp = await self._client.get(f"{self.path}/{configmap_name(name)}")
        if resp.status_code == 404:
            return None, 0
        if resp.status_code != 200:
            raise self._error(resp.status_code, resp.content, name)
        obj: dict[str, Any] = resp.json()
        return value_of(obj), revision_of(obj)

    async def swap(self, name: str, value: bytes, revision: int) -> bool:
        content = json.dumps(self._body(name, value, revision)).encode()
        headers = {"Content-Type": "application/json"}
        if revision == 0:
            resp = await self._client.post(self.path, content=content, headers=headers)
            lost = resp.status_code == 409  # AlreadyExists
        else:
            url = f"{self.path}/{configmap_name(name)}"
            resp = await self._client.put(url, content=content, headers=headers)
            lost = resp.status_code in (404, 409)  # NotFound (deleted), Conflict (modified)
        if lost:
            return False
        if resp.status_code not in (200, 201):
            raise self._error(resp.status_code, resp.content, name)
        return True

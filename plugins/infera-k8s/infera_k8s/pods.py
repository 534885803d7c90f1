"""A worker pod's labels and annotations → a :class:`WorkerRecord` (or None: not routable).

What a worker pod carries (the manifests in ``deploy/kubernetes/`` set all of it)::

    metadata:
      labels:
        app.kubernetes.io/component: infera-worker   # the default selector
        infera.io/engine: vllm
        infera.io/role: prefill                      # mixed (default) | prefill | decode
      annotations:
        infera.io/model: Qwen/Qwen3-8B               # label values cannot hold '/'
        infera.io/port: "8000"                       # engine HTTP port on the pod IP
        infera.io/dp-rank: "0"                       # or "pod-index" (StatefulSet ordinal)
        infera.io/dp-size: "2"
        infera.io/kv-events-port: "5557"             # tcp://<pod IP>:5557
        infera.io/kv-events-format: vllm             # decoder [default: the engine]
        infera.io/kv-block-size: "16"
        infera.io/kv-events-replay-port: "5558"
        infera.io/pd-protocol: vllm-nixl
        infera.io/pd-params: '{"bootstrap_port": 8998}'

Every annotation may also be given as a label of the same key (annotations win).

A worker started by ``infera-run worker … --discovery-backend kubernetes`` with
``INFERA_K8S_POD_NAME`` set publishes its whole record instead, as the JSON annotation
``infera.io/worker-record`` (KV-event and PD ports picked at launch included), and the
annotations above are not needed. Either way the worker id is the pod name. A pod is *active* while its ``Ready`` condition is true,
*draining* once it is being deleted (``deletionTimestamp`` set: in-flight requests finish,
no new ones arrive), and absent from the fleet otherwise (starting, failing readiness,
finished).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from infera_core.worker import Status, WorkerRecord

log = logging.getLogger("infera.discovery.kubernetes")

PREFIX = "infera.io/"
DEFAULT_SELECTOR = "app.kubernetes.io/component=infera-worker"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
RECORD_ANNOTATION = PREFIX + "worker-record"


class PodError(ValueError):
    """A worker pod whose labels/annotations cannot make a record (logged, then skipped)."""


def _meta(pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, dict) else {}


def pod_name(pod: dict[str, Any]) -> str:
    return str(_meta(pod).get("name") or "")


def resource_version(obj: dict[str, Any]) -> str:
    return str(_meta(obj).get("resourceVersion") or "")


def _setting(meta: dict[str, Any], key: str) -> str | None:
    for where in ("annotations", "labels"):
        values = meta.get(where)
        if isinstance(values, dict) and isinstance(values.get(PREFIX + key), str):
            return str(values[PREFIX + key])
    return None


def _int(meta: dict[str, Any], key: str) -> int | None:
    raw = _setting(meta, key)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise PodError(f"{PREFIX}{key}: expected an integer, got {raw!r}") from None


def is_ready(pod: dict[str, Any]) -> bool:
    """The pod's ``Ready`` condition is ``True``."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _started_at(meta: dict[str, Any]) -> float:
    stamp = meta.get("creationTimestamp")
    if isinstance(stamp, str):
        try:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    return 0.0


def _dp_rank(meta: dict[str, Any]) -> int | None:
    if _setting(meta, "dp-rank") == "pod-index":
        raw = (meta.get("labels") or {}).get(POD_INDEX_LABEL)
        if raw is None:
            raise PodError(f"{PREFIX}dp-rank is pod-index but the pod has no {POD_INDEX_LABEL} label")
        return int(raw)
    return _int(meta, "dp-rank")


def _kv_events(meta: dict[str, Any], ip: str, engine: str) -> dict[str, Any] | None:
    port = _int(meta, "kv-events-port")
    if port is None:
        return None
    block_size = _int(meta, "kv-block-size")
    if block_size is None:
        raise PodError(f"{PREFIX}kv-events-port is set but {PREFIX}kv-block-size is not")
    info: dict[str, Any] = {
        "endpoint": f"tcp://{ip}:{port}",
        "format": _setting(meta, "kv-events-format") or engine,
        "block_size": block_size,
    }
    replay = _int(meta, "kv-events-replay-port")
    if replay is not None:
        info["replay_endpoint"] = f"tcp://{ip}:{replay}"
    return info


def _pd(meta: dict[str, Any]) -> dict[str, Any] | None:
    protocol = _setting(meta, "pd-protocol")
    if protocol is None:
        return None
    raw = _setting(meta, "pd-params") or "{}"
    try:
        params = json.loads(raw)
    except ValueError:
        raise PodError(f"{PREFIX}pd-params: not valid JSON: {raw!r}") from None
    if not isinstance(params, dict):
        raise PodError(f"{PREFIX}pd-params: expected a JSON object, got {raw!r}")
    return {"protocol": protocol, "params": params}


def pod_record(pod: dict[str, Any]) -> WorkerRecord | None:
    """The record of a worker pod, or None when the router must not see it (yet, or anymore).

    Raises :class:`PodError` naming the bad label/annotation.
    """
    meta = _meta(pod)
    status = pod.get("status") or {}
    ip = status.get("podIP")
    terminating = bool(meta.get("deletionTimestamp"))
    if not ip or status.get("phase") in ("Succeeded", "Failed"):
        return None
    if not terminating and not is_ready(pod):
        return None
    status_now = Status.DRAINING if terminating else Status.ACTIVE
    published = (meta.get("annotations") or {}).get(RECORD_ANNOTATION)
    if published:
        return _published_record(pod, published, status_now)
    model = _setting(meta, "model")
    port = _int(meta, "port")
    if model is None and port is None:
        return None  # no worker description (yet): a launcher that has not registered
    if not model or port is None:
        raise PodError(f"needs both the {PREFIX}model and {PREFIX}port annotations")
    engine = _setting(meta, "engine") or "unknown"
    host = f"[{ip}]" if ":" in ip else ip
    data: dict[str, Any] = {
        "worker_id": pod_name(pod),
        "url": f"http://{host}:{port}",
        "model": model,
        "engine": engine,
        "role": _setting(meta, "role") or "mixed",
        "status": status_now,
        "dp_rank": _dp_rank(meta),
        "dp_size": _int(meta, "dp-size") or 1,
        "kv_events": _kv_events(meta, ip, engine),
        "pd": _pd(meta),
        "labels": {"pod": pod_name(pod), "namespace": str(meta.get("namespace") or "")},
        "started_at": _started_at(meta),
    }
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        data["labels"]["node"] = str(node)
    try:
        return WorkerRecord.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise PodError(f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def _published_record(pod: dict[str, Any], published: str, status: Status) -> WorkerRecord:
    """The launcher's record, keyed by the pod name; a terminating pod is draining."""
    try:
        record = WorkerRecord.from_json(published)
    except (ValidationError, ValueError) as exc:
        first = exc.errors()[0] if isinstance(exc, ValidationError) else None
        why = f"{'.'.join(map(str, first['loc']))}: {first['msg']}" if first else str(exc)
        raise PodError(f"{RECORD_ANNOTATION}: {why}") from None
    update: dict[str, Any] = {"worker_id": pod_name(pod)}
    if status is Status.DRAINING:
        update["status"] = Status.DRAINING
    return record.model_copy(update=update)


def record_or_none(pod: dict[str, Any]) -> WorkerRecord | None:
    """:func:`pod_record`, logging (with the pod's name) and skipping a malformed pod."""
    try:
        return pod_record(pod)
    except PodError as exc:
        log.warning("kubernetes discovery: skipping pod %s: %s", pod_name(pod), exc)
        return None

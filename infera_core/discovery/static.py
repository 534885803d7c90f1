"""The ``static`` discovery backend: workers listed in a YAML or JSON file.

For engines started without an Infera launcher. The file holds a list of records
(or a mapping with a ``workers`` list); each needs at least ``url`` and ``model``;
``worker_id`` defaults to the url's ``host:port`` and ``engine`` to ``unknown``::

    workers:
      - url: http://10.0.0.5:8000
        model: qwen
      - {worker_id: big, url: http://10.0.0.6:8000, model: qwen, engine: vllm, role: decode}

The file is re-read when its modification time changes (polled every
``DiscoverySettings.static_poll_interval`` seconds); watchers then receive the
differences. A file that becomes unreadable or invalid keeps the last good fleet
(logged). Registering is an error: this backend is read-only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import ValidationError

from infera_core.discovery.base import DiscoverySettings, FleetChange, Registration
from infera_core.discovery.records import SYNCED, diff
from infera_core.errors import DiscoveryError
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.discovery.static")


def _default_id(url: str) -> str:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    return parts.netloc or url


def load_static_file(path: Path) -> dict[str, WorkerRecord]:
    """Parse ``path``; raise :class:`DiscoveryError` naming the file and the bad entry."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise DiscoveryError(f"--static-file {path}: cannot read file ({exc.strerror})") from None
    try:
        data: Any = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise DiscoveryError(f"--static-file {path}: not valid {kind}: {exc}") from None
    if isinstance(data, dict):
        data = data.get("workers")
    if data is None:
        data = []
    if not isinstance(data, list):
        raise DiscoveryError(f"--static-file {path}: expected a list of workers (or a 'workers:' list)")
    out: dict[str, WorkerRecord] = {}
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise DiscoveryError(f"--static-file {path}: worker #{i + 1} is not a mapping")
        entry = {"engine": "unknown", **item}
        if "worker_id" not in entry and isinstance(entry.get("url"), str):
            entry["worker_id"] = _default_id(entry["url"])
        try:
            record = WorkerRecord.model_validate(entry)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(map(str, err["loc"])) or "?"
            raise DiscoveryError(f"--static-file {path}: worker #{i + 1}: {field}: {err['msg']}") from None
        if record.worker_id in out:
            raise DiscoveryError(f"--static-file {path}: worker_id {record.worker_id!r} is listed twice")
        out[record.worker_id] = record
    return out


def _mtime(path: Path) -> float | None:
    try:
        return os.stat(path).st_mtime_ns / 1e9
    except OSError:
        return None


class StaticDiscovery:
    """Read-only discovery from a file, re-read on change."""

    def __init__(self, path: Path, poll_interval: float = 1.0) -> None:
        self.path = path
        self.poll_interval = poll_interval
        self._closed = asyncio.Event()

    async def start(self) -> None:
        self._closed.clear()
        load_static_file(self.path)  # fail early with a clear message

    async def close(self) -> None:
        self._closed.set()

    async def register(self, record: WorkerRecord) -> Registration:
        raise DiscoveryError(
            f"the static discovery backend is read-only (workers are listed in {self.path}); "
            "use --discovery etcd (with --etcd-endpoint) or --discovery memory to register workers"
        )

    async def list_workers(self) -> list[WorkerRecord]:
        records = load_static_file(self.path)
        return [records[k] for k in sorted(records)]

    async def watch(self, *, sync_marker: bool = False) -> AsyncIterator[FleetChange]:
        known: dict[str, WorkerRecord] = {}
        seen_mtime: float | None = -1.0
        while not self._closed.is_set():
            mtime = _mtime(self.path)
            if mtime != seen_mtime:
                seen_mtime = mtime
                try:
                    fresh = load_static_file(self.path)
                except DiscoveryError as exc:
                    log.warning("%s; keeping the last good list of %d workers", exc, len(known))
                else:
                    for change in diff(known, fresh):
                        yield change
                    if sync_marker:
                        yield SYNCED
            try:
                await asyncio.wait_for(self._closed.wait(), self.poll_interval)
            except TimeoutError:
                pass


class StaticDiscoveryFactory:
    name = "static"
    description = "Workers listed in a YAML/JSON file (--static-file), re-read on change; read-only."

    def create(self, settings: DiscoverySettings) -> StaticDiscovery:
        if not settings.static_file:
            raise DiscoveryError("--discovery static needs --static-file FILE (env INFERA_STATIC_FILE)")
        return StaticDiscovery(Path(settings.static_file), settings.static_poll_interval)

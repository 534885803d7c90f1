"""One server process among the N of ``infera-run serve --processes N``: whole-router answers.

Every process listens on a unix socket in the supervisor's directory (``p<i>.sock``) and
answers one request per connection, ``<kind>\\n`` → 8-byte big-endian length + JSON: its
own snapshot of ``metrics``, ``workers``, ``stats``, ``usage`` or ``process``. The process a
client reaches for ``/metrics``, ``/v1/workers``, ``/v1/admin/stats``, ``/v1/admin/usage``
asks every sibling at that moment and merges (:mod:`infera_core.server.aggregate`), so any
process gives the whole router's figures and nothing is shared on the proxying path. A
sibling that does not answer within ``timeout`` is left out, and
``infera_server_processes_reporting`` says so. A restarting sibling refuses the connection at
once; the timeout (5 s) is for a live one that is slow to be scheduled on a loaded machine
(at 2 s, ``/metrics`` on a 2-core box at load 10 sometimes left one out), and stays under
Prometheus' default 10 s scrape timeout. Those routes carry ``x-infera-process``
(which process answered); ``GET /v1/admin/processes`` lists each process's own figures.

API-key budgets (:mod:`infera_core.server.budgets`) and, with ``--max-inflight-per-worker``,
the requests in flight per worker (:mod:`infera_core.scheduling.shared_load`) are the
things the processes share on the request path: :meth:`Peers.install` binds this process's
keys and endpoint table to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from starlette.routing import BaseRoute

from infera_core.scheduling.shared_load import SharedLoad
from infera_core.server.aggregate import (
    family_json,
    merge_families,
    merge_stats,
    merge_usage,
    merge_workers,
    overlay_workers,
)
from infera_core.server.auth import CLIENT_STATE, ClientAuth, require_admin
from infera_core.server.budgets import SharedBudgets
from infera_core.server.core import RouterCore
from infera_core.server.errors import ApiError
from infera_core.server.kv import KvComponent

log = logging.getLogger("infera.server.peers")

PROCESS_HEADER = "x-infera-process"
KINDS = ("metrics", "workers", "stats", "usage", "process")


class _Merged:
    """A registry-like object for ``generate_latest``."""

    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> list[Metric]:
        return self._metrics


class Peers:
    """This process (``index`` of ``count``) and its siblings' sockets under ``directory``."""

    def __init__(
        self,
        index: int,
        count: int,
        directory: str | Path,
        timeout: float = 5.0,
        budgets: SharedBudgets | None = None,
        load: SharedLoad | None = None,
    ) -> None:
        self.index = index
        self.budgets = budgets
        self.load = load
        self.count = count
        self.directory = Path(directory)
        self.timeout = timeout
        self.started_at = time.time()
        self._server: asyncio.AbstractServer | None = None
        self._app: FastAPI | None = None
        self._kv: KvComponent | None = None

    def path(self, index: int) -> Path:
        return self.directory / f"p{index}.sock"

    # -- this process's snapshot -------------------------------------------------------
    @property
    def core(self) -> RouterCore:
        assert self._app is not None
        core: RouterCore = self._app.state.core
        return core

    def _auth(self) -> ClientAuth | None:
        assert self._app is not None
        auth: ClientAuth | None = getattr(self._app.state, CLIENT_STATE, None)
        return auth

    def _requests(self) -> float:
        return sum(c.value for c in self.core.metrics.requests.children.values())

    def snapshot(self, kind: str) -> Any:
        core = self.core
        if kind == "metrics":
            mine = Metric("infera_process_requests", "Requests answered per server process", "counter")
            mine.add_sample("infera_process_requests_total", {"process": str(self.index)}, self._requests())
            return [family_json(m) for m in core.metrics.registry.collect()] + [family_json(mine)]
        if kind == "workers":
            return {
                ep.worker_id: [ep.in_flight, ep.picks, core.breakers.state(ep)]
                for ep in core.table.by_id.values()
            }
        if kind == "stats":
            from infera_core.server.dashboard import stats

            assert self._app is not None
            return stats(core, self._kv, self._auth(), self._app.state.dashboard)
        if kind == "usage":
            auth = self._auth()
            return auth.usage()["keys"] if auth is not None else None
        if kind == "process":
            index = self._kv.index if self._kv is not None else None
            return {
                "process": self.index,
                "pid": os.getpid(),
                "started_at": self.started_at,
                "requests": self._requests(),
                "picks": {ep.worker_id: ep.picks for ep in core.table.by_id.values()},
                "in_flight": sum(ep.in_flight for ep in core.table.by_id.values()),
                "kv_blocks": {
                    wid: sum(v.block_count() for v in index.views_of(wid)) for wid in core.table.by_id
                }
                if index is not None
                else {},
            }
        raise ValueError(f"unknown snapshot kind {kind!r}")

    # -- the socket ----------------------------------------------------------------------
    async def start(self) -> None:
        path = self.path(self.index)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a crashed predecessor's
        self._server = await asyncio.start_unix_server(self._answer, path=str(path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.path(self.index).unlink()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            kind = (await asyncio.wait_for(reader.readline(), self.timeout)).decode().strip()
            data = json.dumps(self.snapshot(kind) if kind in KINDS else None).encode()
            writer.write(len(data).to_bytes(8, "big") + data)
            await writer.drain()
        except Exception:
            log.exception("answering a sibling server process failed")
        finally:
            writer.close()

    async def _ask(self, index: int, kind: str) -> Any:
        reader, writer = await asyncio.open_unix_connection(str(self.path(index)))
        try:
            writer.write(kind.encode() + b"\n")
            await writer.drain()
            size = int.from_bytes(await reader.readexactly(8), "big")
            return json.loads(await reader.readexactly(size))
        finally:
            writer.close()

    async def gather(self, kind: str) -> list[Any]:
        """This process's snapshot first, then every sibling's that answered in time."""

        async def one(i: int) -> Any:
            try:
                return await asyncio.wait_for(self._ask(i, kind), self.timeout)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
                return _MISSING

        others = await asyncio.gather(*(one(i) for i in range(self.count) if i != self.index))
        mine = json.loads(json.dumps(self.snapshot(kind)))  # the same shape as the siblings'
        return [mine, *(o for o in others if o is not _MISSING)]

    # -- the routes -----------------------------------------------------------------------
    def install(self, app: FastAPI, kv: KvComponent | None, public_metrics: bool) -> None:
        """Put whole-router versions of the aggregated routes in front of the app's own."""
        self._app, self._kv = app, kv
        auth = self._auth()
        if auth is not None and self.budgets is not None:
            self.budgets.attach(self.index)
            auth.ring.share(self.budgets)
        if self.load is not None:
            self.load.attach(self.index)
            self.core.table.share_load(self.load)
        admin = [Depends(require_admin)]
        own_workers = _endpoint(app, "/v1/workers")
        header = {PROCESS_HEADER: str(self.index)}
        before = len(app.router.routes)

        @app.get("/metrics", dependencies=[] if public_metrics else admin, include_in_schema=False)
        async def metrics() -> Response:
            snaps = await self.gather("metrics")
            merged = merge_families(snaps)
            merged.append(_gauge("infera_server_processes", "Server processes configured", self.count))
            merged.append(
                _gauge("infera_server_processes_reporting", "Server processes in this scrape", len(snaps))
            )
            body = generate_latest(_Merged(merged))  # type: ignore[arg-type]
            return Response(body, media_type=CONTENT_TYPE_LATEST, headers=header)

        @app.get("/v1/workers", dependencies=admin, include_in_schema=False)
        async def workers() -> JSONResponse:
            body = await own_workers()
            overlay_workers(body["data"], merge_workers(await self.gather("workers")))
            return JSONResponse(body, headers=header)

        @app.get("/v1/admin/stats", dependencies=admin, include_in_schema=False)
        async def admin_stats() -> JSONResponse:
            assert self._app is not None
            self._app.state.dashboard.poke()
            body = merge_stats(await self.gather("stats"))
            return JSONResponse(body, headers={"Cache-Control": "no-store", **header})

        @app.get("/v1/admin/usage", dependencies=admin, include_in_schema=False)
        async def usage() -> JSONResponse:
            keys = merge_usage(await self.gather("usage"))
            if keys is None:
                err = ApiError(404, "Usage per API key needs --api-key-file.", code="api_keys_disabled")
                return JSONResponse(err.payload(), status_code=404, headers=header)
            return JSONResponse({"object": "usage", "keys": keys}, headers=header)

        @app.get("/v1/admin/processes", dependencies=admin, include_in_schema=False)
        async def processes() -> JSONResponse:
            snaps = sorted(await self.gather("process"), key=lambda s: int(s["process"]))
            return JSONResponse({"object": "list", "processes": self.count, "data": snaps}, headers=header)

        added: list[BaseRoute] = app.router.routes[before:]
        del app.router.routes[before:]
        app.router.routes[:0] = added


_MISSING = object()


def _gauge(name: str, doc: str, value: float) -> Metric:
    m = Metric(name, doc, "gauge")
    m.add_sample(name, {}, value)
    return m


def _endpoint(app: FastAPI, path: str) -> Any:
    for route in app.router.routes:
        if isinstance(route, APIRoute) and route.path == path and "GET" in (route.methods or ()):
            return route.endpoint
    raise LookupError(path)

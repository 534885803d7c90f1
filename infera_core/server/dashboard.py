"""The live fleet dashboard: ``GET /dashboard`` (one static page) and ``GET /v1/admin/stats``.

The page (``static/dashboard.html``: inline CSS and JS, no build step, nothing from a
CDN) polls ``/v1/admin/stats`` every second. The stats are cumulative counters and
histogram buckets as the router holds them; the page turns two snapshots into rates
(requests/s, picks/s, tokens/s) and percentiles over its last ten seconds, so the
server keeps no per-viewer state.

Both carry the admin surface's browser security headers
(:mod:`infera_core.server.security_headers`; the page's CSP allows its own inline script and
style by hash, nothing else). Both routes follow the admin rule (``infera_core.server.auth``): loopback clients only
without ``--admin-token``. With a token, a browser cannot send it on a page load, so
the page itself (which holds no data) is served to anyone and asks for the token,
which its script sends as ``Authorization: Bearer`` to the stats route.

Engine-side numbers (running, waiting, prefix-cache hit rate) come from each worker's
``/metrics`` (vLLM's names, which the sim speaks too), scraped at most every two
seconds and only while someone polls the stats.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from importlib.resources import files
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.requests import HTTPConnection

from infera_core.scheduling.fairqueue import tier_label
from infera_core.scheduling.types import Endpoint
from infera_core.server.auth import ADMIN_STATE, CLIENT_STATE, AdminGate, ClientAuth, require_admin
from infera_core.server.core import RouterCore
from infera_core.server.kv import KvComponent
from infera_core.server.security_headers import page_policy
from infera_core.server.series import LeanHistogram
from infera_core.util.redact import redact_url

log = logging.getLogger("infera.server.dashboard")

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
ENGINE_SERIES = (RUNNING, WAITING, KV_USAGE, HITS, QUERIES)


class EngineScraper:
    """Engine gauges per worker for the dashboard, refreshed in the background on demand."""

    def __init__(self, core: RouterCore, interval: float = 2.0, timeout: float = 3.0) -> None:
        self.core = core
        self.interval = interval
        self.timeout = timeout
        self.latest: dict[str, dict[str, float]] = {}
        self._last = 0.0
        self._task: asyncio.Task[None] | None = None

    def poke(self) -> None:
        """Start a refresh unless one ran within ``interval`` seconds or is running."""
        now = time.monotonic()
        if (self._task is not None and not self._task.done()) or now - self._last < self.interval:
            return
        self._last = now
        self._task = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        import httpx  # only when someone watches the dashboard

        from infera_core.util.prom_text import parse_metrics

        eps = [ep for ep in self.core.table.by_id.values() if ep.url.startswith(("http://", "https://"))]
        limit = asyncio.Semaphore(32)

        async def one(client: httpx.AsyncClient, ep: Endpoint) -> None:
            async with limit:
                try:
                    r = await client.get(ep.url.rstrip("/") + "/metrics")
                    if r.status_code != 200:
                        return
                    text = r.text
                except (httpx.HTTPError, ValueError):
                    return  # a busy or gone worker keeps its last numbers until the next round
            out = self._update(ep.worker_id, parse_metrics(text, ENGINE_SERIES))
            gauges: dict[str, float] = {k: out[k] for k in ("running", "waiting", "kv_usage") if k in out}
            if gauges:  # the saturation signal of the router queue (--queue-engine-*)
                ep.stats = gauges

        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                await asyncio.gather(*(one(client, ep) for ep in eps))
        except Exception:
            log.exception("dashboard: scraping the workers' /metrics failed")
        for gone in set(self.latest) - {ep.worker_id for ep in eps}:
            del self.latest[gone]

    def _update(self, worker_id: str, values: dict[str, float]) -> dict[str, float]:
        prev = self.latest.get(worker_id, {})
        hits, queries = values.get(HITS), values.get(QUERIES)
        out: dict[str, float] = {
            k: v
            for k, v in (("running", values.get(RUNNING)), ("waiting", values.get(WAITING)))
            if v is not None
        }
        if KV_USAGE in values:
            out["kv_usage"] = values[KV_USAGE]
        if hits is not None and queries is not None:
            out["hits"], out["queries"] = hits, queries
            d_hits, d_queries = hits - prev.get("hits", 0.0), queries - prev.get("queries", 0.0)
            if d_queries > 0:  # since the last scrape; else the engine's whole life
                out["hit_rate"] = d_hits / d_queries
            elif "hit_rate" in prev:
                out["hit_rate"] = prev["hit_rate"]
            elif queries > 0:
                out["hit_rate"] = hits / queries
        self.latest[worker_id] = out
        return out

    async def watch(self) -> None:
        """Refresh every ``interval`` for good (the router queue's engine saturation signal)."""
        while True:
            self.poke()
            await asyncio.sleep(self.interval)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


_EMPTY_WAIT = {"bounds": [], "labels": ["model", "tier"], "series": {}}


def _histogram(h: LeanHistogram) -> dict[str, Any]:
    """Bucket upper bounds and, per label set (joined with ``|``), counts per bucket and sum."""
    series = {"|".join(labels): {"counts": list(c.counts), "sum": c.sum} for labels, c in h.children.items()}
    return {"bounds": list(h.bounds), "labels": h.labelnames, "series": series}


def stats(
    core: RouterCore, kv: KvComponent | None, auth: ClientAuth | None, engines: EngineScraper
) -> dict[str, Any]:
    """The JSON of ``GET /v1/admin/stats``: everything the dashboard shows, cumulative."""
    cache_view = kv.cache_view if kv is not None else None
    workers = []
    latency = core.metrics.latency
    for ep in sorted(core.table.by_id.values(), key=lambda e: (e.record.model, str(e.role), e.worker_id)):
        rec = ep.record
        row: dict[str, Any] = {
            "worker_id": ep.worker_id,
            "model": rec.model,
            "role": str(rec.role),
            "status": str(rec.status),
            "engine": rec.engine,
            "url": redact_url(rec.url),
            "in_flight": ep.in_flight,
            "picks": ep.picks,
            "breaker": core.breakers.state(ep),
            "engine_stats": engines.latest.get(ep.worker_id, {}),
        }
        if latency is not None and ep.worker_id in latency.predicted:  # predicted-latency routes
            row["predicted_ttft"] = latency.predicted[ep.worker_id]
            row["observed_ttft"] = latency.observed.get(ep.worker_id)
        if cache_view is not None:
            view = cache_view(ep.worker_id)
            row["kv_blocks"] = view.get("blocks")
            row["kv_stale"] = bool(view.get("stale")) or bool(view.get("silent"))
        workers.append(row)
    m = core.metrics
    qm = core.queue.metrics if core.queue is not None else None
    pd = core.pd.metrics if core.pd is not None else None
    return {
        "object": "stats",
        "time": time.time(),
        "models": core.table.models(),
        "routing_modes": core.routing_modes.snapshot() if core.routing_modes is not None else {},
        "workers": workers,
        "requests": [
            {"route": r, "model": model, "status": s, "count": c.value}
            for (r, model, s), c in m.requests.children.items()
        ],
        "tokens": [
            {"model": model, "kind": k, "count": c.value} for (model, k), c in m.tokens.children.items()
        ],
        "retries": sum(c.value for c in m.retries.children.values()),
        "breakers_opened": core.breakers.opened,
        "migrations": _migrations(m.migrations.children.items()),
        "pd_failures": {r: c.value for (r,), c in pd.failures.children.items()} if pd is not None else {},
        "histograms": {
            "ttft": _histogram(m.ttft),
            "itl": _histogram(m.itl),
            "e2e": _histogram(m.e2e),
            "decision": _histogram(m.decision),
            "resume": _histogram(m.resume),
            "queue_wait": _histogram(qm.wait) if qm is not None else _EMPTY_WAIT,
        },
        "queue_depth": [
            {"model": model, "tier": tier_label(tier), "count": n}
            for model, q in (core.queue.queues.items() if core.queue is not None else ())
            for tier, n in q.depth().items()
        ],
        "queue_shed": [
            {"model": model, "tier": tier, "reason": reason, "count": c.value}
            for (model, tier, reason), c in (qm.shed.children.items() if qm is not None else ())
        ],
        "usage": auth.usage()["keys"] if auth is not None else None,
        "last_decisions": core.decisions.recent()[:20] if core.decisions is not None else [],
        "ttft_prediction_mae": latency.mae if latency is not None else None,
    }


def _migrations(children: Iterable[tuple[tuple[str, ...], Any]]) -> dict[str, float]:
    """``infera_migrations_total`` summed over models: ``"<reason> <result>" → count``."""
    out: dict[str, float] = {}
    for (_, reason, result), c in children:
        key = f"{reason} {result}"
        out[key] = out.get(key, 0.0) + c.value
    return out


def _page_allowed(conn: HTTPConnection) -> None:
    """The page holds no data: with an admin token configured it is served to anyone (its
    script asks for the token); without one, to loopback clients only (the admin rule)."""
    gate: AdminGate | None = getattr(conn.app.state, ADMIN_STATE, None)
    if gate is None or not gate.has_token:
        require_admin(conn)


def add_dashboard_routes(app: FastAPI, core: RouterCore, kv: KvComponent | None) -> EngineScraper:
    """Mount ``GET /dashboard`` and ``GET /v1/admin/stats``; returns the scraper to close."""
    engines = EngineScraper(core)
    page = files("infera_core.server").joinpath("static/dashboard.html")

    html = page.read_text(encoding="utf-8")
    headers = {"Cache-Control": "no-store", "Content-Security-Policy": page_policy(html)}

    @app.get("/dashboard", dependencies=[Depends(_page_allowed)], include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(html, headers=headers)

    @app.get("/v1/admin/stats", dependencies=[Depends(require_admin)], include_in_schema=False)
    async def admin_stats(conn: HTTPConnection) -> JSONResponse:
        engines.poke()
        auth: ClientAuth | None = getattr(conn.app.state, CLIENT_STATE, None)
        return JSONResponse(stats(core, kv, auth, engines), headers={"Cache-Control": "no-store"})

    return engines

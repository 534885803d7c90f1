"""Read engine and router ``/metrics`` (Prometheus text) during a run.

Only the few series the bench needs are parsed (a line scan, no full parser), so
scraping a fleet of hundreds of workers every second stays cheap.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from infera_core.bench.stats import CacheStats

if TYPE_CHECKING:  # an optional dependency (infera-core[aiohttp]): the parsers need none
    import aiohttp

from infera_core.util.prom_text import (
    HITS,
    OFFLOAD_HITS,
    PROMPT_TOKENS,
    QUERIES,
    REQUESTS,
    WANTED,
    parse_metrics,
)
from infera_core.util.tasks import cancel_and_wait


async def fetch_text(
    session: aiohttp.ClientSession,
    url: str,
    limit_s: float = 5.0,
    headers: Mapping[str, str] | None = None,
) -> str | None:
    import aiohttp

    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=limit_s), headers=headers) as resp:
            if resp.status != 200:
                return None
            return await resp.text()
    except (aiohttp.ClientError, TimeoutError, ConnectionError):
        return None


async def fetch_workers(
    session: aiohttp.ClientSession, root: str, headers: Mapping[str, str] | None = None
) -> dict[str, str]:
    """worker id → engine base URL, from the router's ``GET /v1/workers`` (empty if none;
    ``headers`` carry the admin token)."""
    import aiohttp

    try:
        timeout = aiohttp.ClientTimeout(total=5)
        async with session.get(f"{root}/v1/workers", timeout=timeout, headers=headers) as resp:
            if resp.status != 200:
                return {}
            data = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ConnectionError, ValueError):
        return {}
    return workers_from_json(data)


def workers_from_json(data: Any) -> dict[str, str]:
    """Accepts a list of records, ``{"workers": [...]}`` or ``{"data": [...]}``."""
    items = data
    if isinstance(data, dict):
        items = data.get("workers", data.get("data", []))
    out: dict[str, str] = {}
    if not isinstance(items, list):
        return out
    for i, w in enumerate(items):
        if not isinstance(w, dict):
            continue
        inner = w.get("record")
        rec: dict[str, Any] = inner if isinstance(inner, dict) else w
        url = rec.get("url")
        if isinstance(url, str) and url:
            out[str(rec.get("worker_id") or w.get("worker_id") or f"worker-{i}")] = url.rstrip("/")
    return out


class MetricsSampler:
    """Samples worker counters through a run; deltas give hit rate and load per worker."""

    def __init__(self, session: aiohttp.ClientSession, workers: Mapping[str, str], interval: float = 1.0):
        self.session = session
        self.urls = {w: (u if u.endswith("/metrics") else f"{u}/metrics") for w, u in workers.items()}
        self.interval = interval
        self._base: dict[str, dict[str, float]] = {}
        self._last: dict[str, dict[str, float]] = {}
        self._timeline: list[tuple[float, float, float]] = []
        self._task: asyncio.Task[None] | None = None
        self._t0 = 0.0

    async def _scrape(self) -> dict[str, dict[str, float]]:
        texts = await asyncio.gather(*(fetch_text(self.session, u) for u in self.urls.values()))
        return {w: parse_metrics(t) for w, t in zip(self.urls, texts, strict=True) if t is not None}

    async def start(self, t0: float | None = None) -> None:
        self._t0 = time.perf_counter() if t0 is None else t0
        if not self.urls:
            return
        self._base = await self._scrape()
        self._last = dict(self._base)
        self._timeline = [(0.0, 0.0, 0.0)]
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.sample()

    async def sample(self) -> None:
        snap = await self._scrape()
        self._last.update(snap)
        hits, queries = self._totals()
        self._timeline.append((time.perf_counter() - self._t0, hits, queries))

    def _totals(self) -> tuple[float, float]:
        hits = queries = 0.0
        for w, m in self._last.items():
            b = self._base.get(w, {})
            hits += m.get(HITS, 0.0) - b.get(HITS, 0.0)
            queries += m.get(QUERIES, 0.0) - b.get(QUERIES, 0.0)
        return hits, queries

    def live_hit_rate(self) -> float | None:
        hits, queries = self._totals()
        return hits / queries if queries > 0 else None

    async def stop(self) -> CacheStats:
        await cancel_and_wait(self._task)
        if not self.urls:
            return CacheStats()
        await self.sample()
        per: dict[str, dict[str, float]] = {}
        for w, m in self._last.items():
            b = self._base.get(w, {})
            d = {k: m.get(k, 0.0) - b.get(k, 0.0) for k in WANTED}
            req_key = next((k for k in REQUESTS if k in m), None)
            per[w] = {
                "hits": d[HITS],
                "offload_hits": d[OFFLOAD_HITS],
                "queries": d[QUERIES],
                "prompt_tokens": d[PROMPT_TOKENS],
                "requests": d[req_key] if req_key else 0.0,
            }
        hits, queries = self._totals()
        offloaded = any(OFFLOAD_HITS in m for m in self._last.values())
        offload_hits = sum(v["offload_hits"] for v in per.values()) if offloaded else None
        return CacheStats(
            queries=queries,
            hits=hits,
            offload_hits=offload_hits,
            per_worker=per,
            timeline=list(self._timeline),
        )

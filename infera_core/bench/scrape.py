"""Read engine and router ``/metrics`` (Prometheus text) during a run.

Only the few series the bench needs are parsed (a line scan, no full parser), so
scraping a fleet of hundreds of workers every second stays cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from infera_core.bench.stats import CacheStats

if TYPE_CHECKING:  # an optional dependency (infera-core[aiohttp]): the parsers here need none
    import aiohttp

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
OFFLOAD_HITS = "vllm:external_prefix_cache_hits_total"
"""Tokens a KV connector supplied (vLLM's CPU offloading, LMCache; the sim's CPU tier)."""
REQUESTS = ("vllm:request_success_total", "vllm:e2e_request_latency_seconds_count")
PROMPT_TOKENS = "vllm:prompt_tokens_total"
WANTED = (HITS, QUERIES, OFFLOAD_HITS, PROMPT_TOKENS, *REQUESTS)


def parse_metrics(text: str, names: Iterable[str] = WANTED) -> dict[str, float]:
    """Sum of every sample of each wanted metric name (labels summed over)."""
    wanted = set(names)
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        end = brace if 0 <= brace < space or (brace >= 0 and space < 0) else space
        name = line[:end]
        if name not in wanted:
            continue
        value = line.rsplit("}", 1)[-1].split()[0] if brace >= 0 else line[space + 1 :].split()[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def by_label(text: str, name: str, label: str) -> dict[str, float]:
    """Samples of ``name`` summed per value of ``label`` (e.g. picks per worker)."""
    out: dict[str, float] = {}
    key = f'{label}="'
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        labels, _, value = line[len(name) + 1 :].rpartition("} ")
        if key not in labels:
            continue
        lv = labels.split(key, 1)[1].split('"', 1)[0]
        try:
            out[lv] = out.get(lv, 0.0) + float(value.split()[0])
        except (ValueError, IndexError):
            continue
    return out


def histogram(text: str, name: str) -> dict[str, Any] | None:
    """Buckets (``le`` → cumulative count), sum and count of a histogram, labels summed."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    seen = False
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        rest = line[len(name) :]
        value = float(line.rsplit(" ", 1)[-1])
        if rest.startswith("_bucket{"):
            seen = True
            le = rest.split('le="', 1)[1].split('"', 1)[0]
            key = float("inf") if le == "+Inf" else float(le)
            buckets[key] = buckets.get(key, 0.0) + value
        elif rest.startswith("_sum"):
            total += value
        elif rest.startswith("_count"):
            count += value
    if not seen:
        return None
    return {"buckets": dict(sorted(buckets.items())), "sum": total, "count": count}


def histogram_quantile(hist: Mapping[str, Any], q: float) -> float | None:
    """Upper bucket bound holding the ``q`` quantile (Prometheus-style, no interpolation)."""
    count = float(hist["count"])
    if count <= 0:
        return None
    target = q * count
    for le, cum in hist["buckets"].items():
        if cum >= target:
            return float(le)
    return None


def histogram_delta(after: Mapping[str, Any], before: Mapping[str, Any] | None) -> dict[str, Any]:
    if before is None:
        return dict(after)
    b = before["buckets"]
    return {
        "buckets": {k: v - b.get(k, 0.0) for k, v in after["buckets"].items()},
        "sum": after["sum"] - before["sum"],
        "count": after["count"] - before["count"],
    }


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
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
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

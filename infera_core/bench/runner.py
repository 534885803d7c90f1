"""Drive a workload against one OpenAI-compatible URL and collect the results.

Arrival: closed loop (``concurrency`` sessions in flight, next one as soon as one
ends) unless sessions carry arrival offsets (Poisson or trace timestamps), in which
case each session starts at its time (open loop), optionally capped at
``concurrency`` in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from infera_core.bench.client import RequestResult, build_body, send
from infera_core.bench.scrape import MetricsSampler, fetch_text, fetch_workers
from infera_core.bench.stats import CacheStats, Slo, percentile, summarize
from infera_core.bench.workloads import Session
from infera_core.errors import InferaError
from infera_core.util.prom_text import QUERIES, by_label, histogram, histogram_delta, histogram_quantile

_DECISION = re.compile(r"^# TYPE (\S*decision\S*) histogram", re.MULTILINE)


class BenchError(InferaError):
    """The target cannot be benchmarked (unreachable, no model…)."""


def api_root(url: str) -> str:
    """``http://h:p/v1`` or ``http://h:p/`` → ``http://h:p``."""
    root = url.rstrip("/")
    if root.endswith("/v1"):
        root = root[:-3]
    if not root.startswith(("http://", "https://")):
        root = "http://" + root
    return root


@dataclass(slots=True)
class BenchConfig:
    url: str
    model: str | None = None
    concurrency: int | None = 8
    timeout: float = 300.0
    ignore_eos: bool = True
    slo: Slo = field(default_factory=Slo)
    metrics_urls: list[str] = field(default_factory=list)
    scrape_interval: float = 0.25
    """Seconds between worker /metrics samples (at least workers/64 s, to spare large fleets)."""
    label: str = ""
    progress: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None
    """Sent as ``Authorization: Bearer`` with every request and ``/v1/models``."""
    admin_token: str | None = None
    """Sent to the router's admin routes (``/metrics``, ``/v1/workers``), never to workers."""
    stop: asyncio.Event | None = None
    """Set it to stop sending new sessions; requests in flight finish and the run is summarized."""


@dataclass(slots=True)
class RunResult:
    label: str
    url: str
    model: str
    results: list[RequestResult]
    duration: float
    cache: CacheStats
    summary: dict[str, Any]
    router: dict[str, Any] = field(default_factory=dict)

    def as_dict(self, with_requests: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "label": self.label,
            "url": self.url,
            "model": self.model,
            "summary": self.summary,
            "router": self.router,
            "cache": {
                "hits": self.cache.hits,
                "offload_hits": self.cache.offload_hits,
                "queries": self.cache.queries,
                "per_worker": self.cache.per_worker,
                "timeline": self.cache.timeline,
            },
        }
        if with_requests:
            out["requests"] = [r.as_dict() for r in self.results]
        return out


def _bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def _default_model(session: aiohttp.ClientSession, root: str, headers: dict[str, str]) -> str:
    try:
        timeout = aiohttp.ClientTimeout(total=10)
        async with session.get(f"{root}/v1/models", timeout=timeout, headers=headers) as resp:
            if resp.status in (401, 403):
                raise BenchError(
                    f"--url {root}: /v1/models answered {resp.status} (the router wants an API key):"
                    " pass --api-key or INFERA_API_KEY"
                )
            data = await resp.json(content_type=None)
            return str(data["data"][0]["id"])
    except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
        raise BenchError(f"--url {root}: cannot reach /v1/models ({exc or type(exc).__name__})") from None
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError(f"--url {root}: /v1/models lists no model; pass --model") from None


class _Runner:
    def __init__(self, cfg: BenchConfig, session: aiohttp.ClientSession, model: str, root: str) -> None:
        self.cfg = cfg
        self.session = session
        self.model = model
        self.root = root
        self.results: list[RequestResult] = []
        self.t0 = 0.0
        self.advance: Callable[[int], None] = lambda n: None

    def _url(self, api: str) -> str:
        return f"{self.root}/v1/chat/completions" if api == "chat" else f"{self.root}/v1/completions"

    async def run_session(self, s: Session) -> None:
        msgs: list[dict[str, str]] = []
        system = s.extra.get("system")
        if s.api == "chat" and isinstance(system, str) and system:
            msgs.append({"role": "system", "content": system})
        history: str | list[int] = ""
        multi = len(s.turns) > 1
        for k, turn in enumerate(s.turns):
            if k and s.think_time > 0:
                await asyncio.sleep(s.think_time)
            prompt: Any
            if s.api == "chat":
                msgs.append({"role": "user", "content": str(turn.prompt)})
                prompt = list(msgs)
            elif isinstance(turn.prompt, list):
                prompt = (history if isinstance(history, list) else []) + turn.prompt
            else:
                prompt = f"{history} {turn.prompt}" if history else turn.prompt
            body = build_body(
                s.api, self.model, prompt, turn.max_tokens, self.cfg.ignore_eos, self.cfg.extra_body
            )
            res = await send(
                self.session,
                self._url(s.api),
                body,
                self.t0,
                self.cfg.timeout,
                keep_text=multi,
                headers=_bearer(self.cfg.api_key),
            )
            res.group = turn.group
            self.results.append(res)
            self.advance(1)
            if not res.ok:
                self.advance(len(s.turns) - k - 1)
                return
            if s.api == "chat":
                msgs.append({"role": "assistant", "content": res.text})
            elif isinstance(prompt, str):
                history = f"{prompt} {res.text.strip()}".strip()
            else:
                history = prompt

    async def closed_loop(self, sessions: Sequence[Session], concurrency: int) -> None:
        it = iter(sessions)

        async def worker() -> None:
            for s in it:
                if self._stopped():
                    return
                await self.run_session(s)

        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))

    async def open_loop(self, sessions: Sequence[Session], cap: int | None) -> None:
        sem = asyncio.Semaphore(cap) if cap else None
        tasks: list[asyncio.Task[None]] = []

        async def one(s: Session) -> None:
            if sem is None:
                await self.run_session(s)
                return
            async with sem:
                await self.run_session(s)

        stop = self.cfg.stop
        for s in sessions:
            delay = (s.at or 0.0) - (time.perf_counter() - self.t0)
            if delay > 0:
                if stop is None:
                    await asyncio.sleep(delay)
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
            if self._stopped():
                break
            tasks.append(asyncio.create_task(one(s)))
        await asyncio.gather(*tasks)

    def _stopped(self) -> bool:
        return self.cfg.stop is not None and self.cfg.stop.is_set()


def _live_text(runner: _Runner, sampler: MetricsSampler) -> str:
    done = [r for r in runner.results if r.ok]
    el = max(time.perf_counter() - runner.t0, 1e-9)
    recent = [r.ttft for r in done[-200:] if r.ttft is not None]
    p50 = percentile(recent, 50)
    errs = len(runner.results) - len(done)
    hit = sampler.live_hit_rate()
    parts = [
        f"{len(done) / el:6.1f} req/s",
        f"{sum(r.output_tokens for r in done) / el:8.0f} tok/s",
        f"TTFT p50 {p50 * 1000:7.1f} ms" if p50 is not None else "TTFT p50     - ms",
        f"hit {hit:5.1%}" if hit is not None else "hit    -",
        f"err {errs}",
    ]
    return "  ".join(parts)


PICKS = "infera_worker_picks_total"


async def _router_snapshot(
    session: aiohttp.ClientSession, root: str, headers: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """Routing-decision histograms and picks per worker from the router's ``/metrics``."""
    text = await fetch_text(session, f"{root}/metrics", headers=headers)
    if not text:
        return {}
    out: dict[str, dict[str, Any]] = {PICKS: by_label(text, PICKS, "worker")}
    for name in _DECISION.findall(text):
        h = histogram(text, name)
        if h is not None:
            out[name] = h
    return out


def _picks(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, int]:
    b = before.get(PICKS, {})
    deltas = {w: int(v - b.get(w, 0.0)) for w, v in after.get(PICKS, {}).items()}
    return {w: n for w, n in deltas.items() if n > 0}


def _router_summary(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, h in after.items():
        if name == PICKS:
            continue
        d = histogram_delta(h, before.get(name))
        if d["count"] <= 0:
            continue
        out[name] = {
            "count": d["count"],
            "mean_s": d["sum"] / d["count"],
            "p50_le_s": histogram_quantile(d, 0.5),
            "p99_le_s": histogram_quantile(d, 0.99),
        }
    return out


async def run_bench(
    sessions: Sequence[Session], cfg: BenchConfig, console: Console | None = None
) -> RunResult:
    """Run ``sessions`` against ``cfg.url``; prints a live progress bar on ``console``."""
    root = api_root(cfg.url)
    n_req = sum(s.num_requests for s in sessions)
    # no connection cap: open-loop arrivals must not queue inside the client (that would count as TTFT)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        admin = _bearer(cfg.admin_token)
        model = cfg.model or await _default_model(session, root, _bearer(cfg.api_key))
        workers = {u: u for u in cfg.metrics_urls} or await fetch_workers(session, root, admin)
        if not workers and QUERIES in (await fetch_text(session, f"{root}/metrics", headers=admin) or ""):
            workers = {root: root}  # the target is an engine itself (vLLM-style /metrics)
        interval = max(cfg.scrape_interval, len(workers) / 64)
        sampler = MetricsSampler(session, workers, interval)
        runner = _Runner(cfg, session, model, root)
        router_before = await _router_snapshot(session, root, admin)
        open_loop = any(s.at is not None for s in sessions)
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[live]}"),
            console=console or Console(stderr=True),
            disable=not cfg.progress,
            transient=False,
        )
        label = cfg.label or root
        with progress:
            task = progress.add_task(label, total=n_req, live="")
            runner.advance = lambda n: progress.advance(task, n)
            runner.t0 = time.perf_counter()
            await sampler.start(runner.t0)

            async def ticker() -> None:
                while True:
                    progress.update(task, live=_live_text(runner, sampler))
                    await asyncio.sleep(0.5)

            tick = asyncio.create_task(ticker())
            try:
                if open_loop:
                    await runner.open_loop(sessions, cfg.concurrency)
                else:
                    await runner.closed_loop(sessions, cfg.concurrency or 1)
            finally:
                duration = time.perf_counter() - runner.t0
                tick.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await tick
                cache = await sampler.stop()
            progress.update(task, live=_live_text(runner, sampler))
        router_after = await _router_snapshot(session, root, admin)
    router = _router_summary(router_before, router_after)
    summary = summarize(runner.results, duration, cfg.slo, cache if workers else None)
    picks = _picks(router_before, router_after)
    if picks:
        summary["requests_per_worker"] = picks
    return RunResult(label, root, model, runner.results, duration, cache, summary, router)

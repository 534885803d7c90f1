"""The compact live status of ``infera-run up``: workers, in-flight, requests, cache hits."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx
from rich.console import Console
from rich.live import Live
from rich.text import Text

from infera_core.util.prom_text import HITS, QUERIES, parse_metrics
from infera_core.util.tasks import cancel_and_wait

TROUBLE = {
    "unhealthy": "hung (out of rotation)",
    "restarting": "restarting",
    "starting": "starting",
    "failed": "down for good",
}
"""Launcher states worth a word on the status line, and that word."""


@dataclass(slots=True)
class Snapshot:
    active: int = 0
    draining: int = 0
    in_flight: int = 0
    requests: int = 0
    hits: float = 0.0
    queries: float = 0.0

    def line(self, policy: str, states: Mapping[str, int] | None = None) -> Text:
        """The status line; ``states`` counts the launchers per state (restarting, failed…)."""
        rate = f"{self.hits / self.queries:.1%}" if self.queries else "-"
        trouble = {k: n for k, n in (states or {}).items() if k in TROUBLE and n}
        t = Text()
        t.append("● ", style="red" if not self.active else "yellow" if trouble else "green")
        t.append(f"workers {self.active}")
        if self.draining:
            t.append(f" (+{self.draining} draining)", style="yellow")
        if trouble:
            words = ", ".join(f"{n} {TROUBLE[k]}" for k, n in trouble.items())
            t.append(f" [{words}]", style="red" if "failed" in trouble else "yellow")
        t.append(f"  in-flight {self.in_flight}  requests {self.requests}  cache hit {rate}  policy {policy}")
        return t


async def _text(client: httpx.AsyncClient, url: str) -> str | None:
    try:
        resp = await client.get(url)
    except httpx.HTTPError:
        return None
    return resp.text if resp.status_code == 200 else None


async def snapshot(
    client: httpx.AsyncClient,
    root: str,
    with_cache: bool = True,
    headers: Mapping[str, str] | None = None,
) -> Snapshot:
    """Router's ``/v1/workers`` (status, in-flight, picks) + workers' prefix-cache counters."""
    snap = Snapshot()
    try:
        data = (await client.get(f"{root}/v1/workers", headers=headers)).json()
    except (httpx.HTTPError, ValueError):
        return snap
    workers = data.get("data", []) if isinstance(data, dict) else []
    urls = []
    for w in workers:
        if w.get("status") == "active":
            snap.active += 1
        else:
            snap.draining += 1
        snap.in_flight += int(w.get("in_flight") or 0)
        snap.requests += int(w.get("picks") or 0)
        if w.get("url"):
            urls.append(str(w["url"]).rstrip("/") + "/metrics")
    if with_cache and urls:
        texts = await asyncio.gather(*(_text(client, u) for u in urls))
        for t in texts:
            if t:
                m = parse_metrics(t, (HITS, QUERIES))
                snap.hits += m.get(HITS, 0.0)
                snap.queries += m.get(QUERIES, 0.0)
    return snap


class LiveStatus:
    """Refreshes one status line every ``interval`` seconds until :meth:`stop`."""

    def __init__(
        self,
        root: str,
        policy: str,
        interval: float,
        console: Console | None = None,
        states: Callable[[], Mapping[str, int]] | None = None,
        admin_token: str | None = None,
    ) -> None:
        self.headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else None
        """Sent with every request: ``/v1/workers`` is admin-only (``--admin-token``)."""
        self.root = root
        self.states = states
        self.policy = policy
        self.interval = interval
        self.console = console or Console(stderr=True)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=2.0) as client:
            with Live(Text("starting…"), console=self.console, refresh_per_second=4, transient=True) as live:
                while True:
                    snap = await snapshot(client, self.root, headers=self.headers)
                    live.update(snap.line(self.policy, self.states() if self.states else None))
                    await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

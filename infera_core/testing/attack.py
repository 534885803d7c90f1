"""Huge-prompt attacks on a real router process, measured: its RSS (psutil) and how long
``/health`` takes while they run. Used by the tests of the routing tokenizer's bounds and by
``bench/chaos`` (rows 1–2 of issue #28).

``RefusingEngine`` is a stand-in engine on loopback that reads each request body (in
chunks, keeping none of it) and refuses it with vLLM's 400 for a prompt over the model's
context, so the engine costs nothing and only the router's own work is measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from infera_core.testing.serve_processes import poll, start_serve
from infera_core.testing.upstream import LoopbackStreamServer
from infera_core.util.net import stop_process

REFUSAL = json.dumps(
    {
        "error": {
            "message": "This model's maximum context length is 4096 tokens. However, your request has"
            " more input tokens. Please reduce the length of the input.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }
).encode()


class RefusingEngine(LoopbackStreamServer):
    """A loopback HTTP/1.1 server answering every POST with 400 (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ValueError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                while length:
                    length -= len(await reader.read(min(length, 1 << 20)))
                self.requests += 1
                writer.write(
                    b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(REFUSAL), REFUSAL)
                )
                await writer.drain()
        writer.close()
        self.writers.discard(writer)


@contextlib.contextmanager
def refusing_engine() -> Iterator[RefusingEngine]:
    """A :class:`RefusingEngine` served by its own event loop in a background thread."""
    loop = asyncio.new_event_loop()
    engine = RefusingEngine()
    thread = threading.Thread(target=loop.run_forever, name="refusing-engine", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(engine.__aenter__(), loop).result(10)
    try:
        yield engine
    finally:
        asyncio.run_coroutine_threadsafe(engine.__aexit__(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@dataclass
class OneServe:
    """``infera-run serve --processes 1`` as a subprocess: ``url`` and its process ``proc``."""

    url: str
    proc: subprocess.Popen[str]


@contextlib.contextmanager
def serve_one(workers: list[dict[str, Any]], directory: Path, *args: str) -> Iterator[OneServe]:
    """One router process serving ``workers`` (static fleet records) with ``args``; returns
    once its ``/health`` counts every worker."""
    url, proc = start_serve(workers, directory, 1, args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            r = httpx.get(url + "/health", timeout=2)
        except httpx.HTTPError:
            return False
        return r.status_code == 200 and r.json().get("active_workers") == len(workers)

    try:
        poll(healthy)
        yield OneServe(url, proc)
    finally:
        stop_process(proc, grace=30)


def big_prompt(chars: int, seed: int = 0) -> str:
    """``chars`` characters of varied words (many tokens for any tokenizer), distinct per ``seed``."""
    unit = " ".join(f"w{seed}x{i % 9973}" for i in range(4096)) + " "
    return (unit * (chars // len(unit) + 1))[:chars]


@dataclass
class AttackReport:
    """What the router did during an attack (bytes and seconds)."""

    rss_before: int = 0
    rss_peak: int = 0
    rss_after: int = 0
    health_max_s: float = 0.0
    health_checks: int = 0
    statuses: list[int] = field(default_factory=list)
    detail: str = ""
    """The last answer's body (its first 300 bytes)."""

    @property
    def grew(self) -> int:
        """Peak RSS over the RSS before the attack."""
        return self.rss_peak - self.rss_before

    @property
    def kept(self) -> int:
        """RSS once the attack is over, over the RSS before it."""
        return self.rss_after - self.rss_before

    def line(self) -> str:
        mb = 1 << 20
        return (
            f"router RSS {self.rss_before / mb:.0f} MB, peak +{self.grew / mb:.0f} MB, kept"
            f" {self.kept / mb:+.0f} MB; /health worst {self.health_max_s * 1e3:.0f} ms over"
            f" {self.health_checks} checks; statuses {sorted(set(self.statuses))}"
        )


class RssExceeded(AssertionError):
    """The router's RSS grew past the bound during the attack (it was stopped there)."""


async def attack(
    url: str,
    pid: int,
    bodies: list[bytes],
    concurrency: int,
    rss_bound: int,
    path: str = "/v1/completions",
) -> AttackReport:
    """POST ``bodies`` to the router at ``url`` (process ``pid``), ``concurrency`` at a time,
    while ``/health`` is polled and the process's RSS sampled; raises :class:`RssExceeded`
    as soon as RSS grows by more than ``rss_bound`` bytes (so today's unbounded router is
    stopped long before it takes the machine's memory)."""
    proc = psutil.Process(pid)
    report = AttackReport(rss_before=proc.memory_info().rss)
    report.rss_peak = report.rss_before
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:

        async def watch_rss() -> None:
            while not done.is_set():
                rss = proc.memory_info().rss
                report.rss_peak = max(report.rss_peak, rss)
                if rss - report.rss_before > rss_bound:
                    raise RssExceeded(
                        f"router RSS grew by {(rss - report.rss_before) >> 20} MB: {report.line()}"
                    )
                await asyncio.sleep(0.02)

        async def watch_health() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=60) as h:
                while not done.is_set():
                    t0 = time.monotonic()
                    await h.get("/health")
                    report.health_max_s = max(report.health_max_s, time.monotonic() - t0)
                    report.health_checks += 1
                    await asyncio.sleep(0.02)

        queue = list(reversed(bodies))

        async def sender() -> None:
            while queue:
                body = queue.pop()
                r = await client.post(path, content=body, headers={"content-type": "application/json"})
                report.statuses.append(r.status_code)
                report.detail = r.text[:300]

        async def senders() -> None:
            try:
                await asyncio.gather(*(sender() for _ in range(concurrency)))
            finally:
                done.set()

        await _first_failure(senders(), watch_rss(), watch_health())
    report.rss_after = await settled_rss(proc)
    return report


async def _first_failure(*jobs: Awaitable[None]) -> None:
    """Run ``jobs`` together; the first to raise cancels the others and its error is raised."""
    tasks = [asyncio.ensure_future(j) for j in jobs]
    try:
        for t in asyncio.as_completed(tasks):
            await t
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def settled_rss(proc: psutil.Process, within: float = 10.0) -> int:
    """The process's RSS once it stopped falling (sampled every 0.1 s, at most ``within`` s)."""
    last: int = proc.memory_info().rss
    deadline = time.monotonic() + within
    steady = 0
    while time.monotonic() < deadline and steady < 5:
        await asyncio.sleep(0.1)
        rss: int = proc.memory_info().rss
        steady = steady + 1 if rss >= last else 0
        last = min(last, rss)
    return last

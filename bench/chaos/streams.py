"""Chaos scenarios: the serving worker killed (-9), frozen (SIGSTOP) or drained in the middle
of concurrent streams. With migration (``--migration-limit``, ``docs/how-to/migration.md``)
every stream must finish whole: the row reports client-visible failures (target 0) and the
router's resume time (p50 / p99 of ``infera_migration_resume_seconds``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Awaitable, Callable

import httpx

from bench.chaos.stack import ChaosStack, Row, scenario

STREAM_MODEL = "chaos-streams"
STREAMS = 16
TOKENS = 400
WORKERS = ("st-1", "st-2")


async def _one_stream(stack: ChaosStack, i: int) -> str | None:
    """One greedy stream of ``TOKENS`` tokens; None when it came whole, else what went wrong."""
    body = {
        "model": STREAM_MODEL,
        "messages": [{"role": "user", "content": f"stream {i}: tell a long story"}],
        "max_tokens": TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    done, tokens = False, 0
    try:
        async with stack.client.stream(
            "POST", f"{stack.root}/v1/chat/completions", json=body, headers=stack.headers(), timeout=120
        ) as r:
            if r.status_code != 200:
                return f"HTTP {r.status_code}"
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        return "error event"
                    tokens = int((event.get("usage") or {}).get("completion_tokens") or tokens)
    except httpx.HTTPError as exc:
        return type(exc).__name__
    if not done:
        return "no [DONE]"
    return None if tokens == TOKENS else f"{tokens} of {TOKENS} tokens"


async def _resume_buckets(stack: ChaosStack) -> dict[float, float]:
    text = (await stack.client.get(f"{stack.root}/metrics", headers=stack.admin(), timeout=10)).text
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith("infera_migration_resume_seconds_bucket{") and f'model="{STREAM_MODEL}"' in line:
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = out.get(float(le), 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _quantile(before: dict[float, float], after: dict[float, float], q: float) -> str:
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return "–"
    want = q * counts[-1]
    for bound, n in zip(bounds, counts, strict=True):
        if n >= want:
            return "≤ " + (f"{bound * 1000:.0f} ms" if bound < 1 else f"{bound:g} s")
    return "> " + f"{bounds[-2]:g} s"


async def _under_streams(
    stack: ChaosStack,
    tried: str,
    fault: Callable[[], Awaitable[object]],
    after: Callable[[], Awaitable[object]],
) -> Row:
    for wid in WORKERS:  # slow sims (real time): streams last seconds, long enough to be cut
        stack.add_worker(wid, "--speedup", "1", "--itl-base-ms", "10", model=STREAM_MODEL, restart=False)
    try:
        if await stack.wait_active(stack.n_workers + len(WORKERS), 120) is None:
            return Row(tried, "the stream workers never registered", "-", False)
        before = await _resume_buckets(stack)
        streams = [asyncio.create_task(_one_stream(stack, i)) for i in range(STREAMS)]
        await asyncio.sleep(1.0)  # every stream under way
        await fault()
        results = await asyncio.gather(*streams)
        await after()
        failed = [r for r in results if r is not None]
        resumed = await _resume_buckets(stack)
        p50, p99 = _quantile(before, resumed, 0.5), _quantile(before, resumed, 0.99)
        sees = f"{STREAMS - len(failed)}/{STREAMS} streams whole ({TOKENS} tokens each); resume p50 {p50}, p99 {p99}"
        if failed:
            sees += "; failures: " + ", ".join(sorted(set(failed)))
        return Row(tried, sees, "nothing" if not failed else f"{len(failed)} streams", not failed)
    finally:
        for wid in WORKERS:
            if wid in stack.workers:
                stack.stop_worker(wid, fast=True)


async def _engine(stack: ChaosStack) -> int:
    pid = await stack.engine_pid(WORKERS[0])
    assert pid is not None, "no engine under the stream worker"
    return pid


async def _nothing() -> None:
    return None


@scenario(fast=False)
async def streams_kill9(stack: ChaosStack) -> Row:
    async def kill() -> None:
        os.kill(await _engine(stack), signal.SIGKILL)

    return await _under_streams(
        stack, f"{STREAMS} streams; their worker's engine killed with -9", kill, _nothing
    )


@scenario(fast=False)
async def streams_sigstop(stack: ChaosStack) -> Row:
    frozen: list[int] = []

    async def stop() -> None:
        frozen.append(await _engine(stack))
        os.kill(frozen[0], signal.SIGSTOP)

    async def resume() -> None:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)

    return await _under_streams(
        stack, f"{STREAMS} streams; their worker's engine frozen (SIGSTOP past --hang-timeout)", stop, resume
    )


@scenario(fast=False)
async def streams_drain(stack: ChaosStack) -> Row:
    async def drain() -> None:
        stack.stop_worker(WORKERS[0])  # SIGTERM: draining; the router moves its streams after --drain-grace

    return await _under_streams(stack, f"{STREAMS} streams; their worker drained (SIGTERM)", drain, _nothing)

"""Chaos scenarios: the serving worker killed (-9), frozen (SIGSTOP) or drained in the middle
of concurrent streams. With migration (``--migration-limit``, ``docs/how-to/migration.md``)
every stream must finish whole: the row reports client-visible failures (target 0) and the
router's resume time (p50 / p99 of ``infera_migration_resume_seconds``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from bench.chaos.stack import ChaosStack, Row, scenario, wait_until

STREAM_MODEL = "chaos-streams"
STREAMS = 16
TOKENS = 400
WORKERS = ("st-1", "st-2")


async def _one_stream(stack: ChaosStack, i: int, root: str | None = None) -> str | None:
    """One greedy stream of ``TOKENS`` tokens (through ``root``, the stack's router unless
    given); None when it came whole, else what went wrong."""
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
            "POST",
            f"{root or stack.root}/v1/chat/completions",
            json=body,
            headers=stack.headers(),
            timeout=120,
        ) as r:
            if r.status_code != 200:
                return f"HTTP {r.status_code}"
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        error = event["error"]
                        message = error.get("message") if isinstance(error, dict) else error
                        return f"error event ({str(message)[:400]})"
                    tokens = int((event.get("usage") or {}).get("completion_tokens") or tokens)
    except httpx.HTTPError as exc:
        return type(exc).__name__
    if not done:
        return "no [DONE]"
    return None if tokens == TOKENS else f"{tokens} of {TOKENS} tokens"


async def _resume_buckets(stack: ChaosStack, root: str | None = None) -> dict[float, float]:
    text = (await stack.client.get(f"{root or stack.root}/metrics", headers=stack.admin(), timeout=10)).text
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
        if (missing := await stack.wait_workers(WORKERS, 120)) is not None:
            return Row(tried, f"the stream workers never registered: {missing}", "-", False)
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


# -- the soak: many faults under steady load ----------------------------------------------------
SOAK_WORKERS = ("sk-1", "sk-2", "sk-3")


@dataclass(slots=True)
class Soak:
    """The soak's size (``run.py --soak-kills/--soak-stops/--soak-drains/--soak-streams``)."""

    kills: int = 30
    """kill -9s of a serving worker (its engine and launcher; a fresh worker takes its place)"""
    stops: int = 5
    """SIGSTOPs of a serving worker's engine, held until the router moved its streams (``hung``)"""
    drains: int = 5
    """SIGTERMs of a serving worker's launcher (drain; the router moves its streams after the 2 s
    grace; a fresh worker takes its place once it exited)"""
    streams: int = 32
    """concurrent streams, each started again as soon as it ends, until the faults are done"""
    migration_limit: int = 8
    """``--migration-limit`` of the soak's router: a stream may meet several faults"""
    hang_timeout: float = 3.0
    """``--hang-timeout`` of the soak's router: a frozen worker's streams move before its
    launcher's health checks (about 12 s) give up on the engine"""

    @property
    def limit_s(self) -> float:
        """How long the scenario may take (the runner's timeout)."""
        return 240.0 + 8.0 * (self.kills + self.stops) + 20.0 * self.drains


SOAK = Soak()


async def _soak_fleet(stack: ChaosStack, root: str) -> dict[str, dict[str, Any]]:
    try:
        r = await stack.client.get(f"{root}/v1/workers", headers=stack.admin(), timeout=5)
        data = r.json().get("data", [])
    except (httpx.HTTPError, ValueError):
        return {}
    return {str(w.get("worker_id")): w for w in data if isinstance(w, dict)}


async def _migrations(stack: ChaosStack, root: str, reason: str) -> float:
    text = (await stack.client.get(f"{root}/metrics", headers=stack.admin(), timeout=10)).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("infera_migrations_total{")
        and f'model="{STREAM_MODEL}"' in line
        and f'reason="{reason}"' in line
    )


def _add_soak_worker(stack: ChaosStack, wid: str) -> None:
    stack.add_worker(wid, "--speedup", "1", "--itl-base-ms", "10", model=STREAM_MODEL)


@scenario(fast=False)
async def streams_soak(stack: ChaosStack) -> Row:
    """Steady streams through faults: kill -9s, SIGSTOPs past the hang threshold and drains."""
    soak = SOAK
    tried = (
        f"{soak.streams} concurrent streams, restarted as they end; {soak.kills} kill -9s, "
        f"{soak.stops} SIGSTOPs and {soak.drains} drains (2 s grace) of serving workers, one at a time"
    )
    current = list(SOAK_WORKERS)
    for wid in current:
        _add_soak_worker(stack, wid)
    errors: list[str] = []
    whole = 0
    faults = 0
    try:
        if (missing := await stack.wait_workers(current, 120)) is not None:
            return Row(tried, f"the soak workers never registered: {missing}", "-", False)
        async with stack.second_router(
            "--drain-grace",
            "2",
            "--hang-timeout",
            str(soak.hang_timeout),
            "--migration-limit",
            str(soak.migration_limit),
        ) as root:
            before = await _resume_buckets(stack, root)
            stop = asyncio.Event()

            async def load(i: int) -> None:
                nonlocal whole
                n = 0
                while not stop.is_set():
                    got = await _one_stream(stack, i * 1000 + n, root)
                    n += 1
                    if got is None:
                        whole += 1
                    else:
                        errors.append(got)

            async def serving(wid: str) -> bool:
                w = (await _soak_fleet(stack, root)).get(wid) or {}
                return w.get("status") == "active" and int(w.get("in_flight") or 0) > 0

            async def all_active() -> bool:
                fleet = await _soak_fleet(stack, root)
                return all((fleet.get(w) or {}).get("status") == "active" for w in current)

            async def wait(what: str, cond: Callable[[], Awaitable[bool]], within: float = 60) -> None:
                if await wait_until(cond, within) is None:
                    raise RuntimeError(f"{what} did not happen within {within:g} s")

            loads = [asyncio.create_task(load(i)) for i in range(soak.streams)]
            try:
                for n, kind in enumerate(_interleave(soak)):
                    slot = n % len(current)
                    wid = current[slot]
                    await wait("every soak worker active", all_active, 90)

                    async def busy(w: str = wid) -> bool:
                        return await serving(w)

                    await wait(f"{wid} serving streams", busy)
                    if kind == "stop":
                        pid = await stack.engine_pid(wid)
                        assert pid is not None, f"no engine under {wid}"
                        hung = await _migrations(stack, root, "hung")
                        os.kill(pid, signal.SIGSTOP)
                        try:

                            async def moved(h: float = hung) -> bool:
                                return await _migrations(stack, root, "hung") > h

                            await wait(f"{wid}'s streams moved (hung)", moved)
                        finally:  # its launcher may have restarted it meanwhile
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(pid, signal.SIGCONT)
                    else:
                        if kind == "kill":  # the engine and its launcher: the worker is gone at once
                            pid = await stack.engine_pid(wid)
                            assert pid is not None, f"no engine under {wid}"
                            os.kill(pid, signal.SIGKILL)
                            proc = stack.stop_worker(wid, sig=signal.SIGKILL)
                        else:
                            proc = stack.stop_worker(wid)  # SIGTERM: draining
                        await asyncio.to_thread(proc.wait, 60)
                        # a fresh worker in its place (a new id: the old record may linger until its lease ends)
                        current[slot] = f"sk-{slot + 1}.{n}"
                        _add_soak_worker(stack, current[slot])
                    faults += 1
            finally:
                stop.set()
                await asyncio.gather(*loads)
            resumed = await _resume_buckets(stack, root)
    finally:
        for wid in current:
            if wid in stack.workers:
                stack.stop_worker(wid, fast=True)
    p50, p99 = _quantile(before, resumed, 0.5), _quantile(before, resumed, 0.99)
    total = whole + len(errors)
    sees = (
        f"{whole}/{total} streams whole ({TOKENS} tokens each), {faults} faults; resume p50 {p50}, p99 {p99}"
    )
    if errors:
        sees += "; failures: " + ", ".join(f"{k} ×{v}" for k, v in sorted(Counter(errors).items()))
    return Row(tried, sees, "nothing" if not errors else f"{len(errors)} streams", not errors and total > 0)


def _interleave(soak: Soak) -> list[str]:
    """The faults in an order that spreads each kind over the run."""
    kinds = [("kill", soak.kills), ("stop", soak.stops), ("drain", soak.drains)]
    total = sum(n for _, n in kinds)
    slots = sorted(((j + 0.5) / n, i, kind) for i, (kind, n) in enumerate(kinds) for j in range(n))
    assert len(slots) == total
    return [kind for _, _, kind in slots]

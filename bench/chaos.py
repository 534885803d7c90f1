"""Chaos: bad inputs and faulty workers thrown at a real stack; a Markdown table of what happened.

    .venv/bin/python bench/chaos.py                 # every scenario (~5 min on 2 cores)
    .venv/bin/python bench/chaos.py --fast          # the quick ones only
    .venv/bin/python bench/chaos.py --only deep_json,killed_engine --out table.md

The stack (:mod:`chaos_stack`): a real etcd, ``infera-run serve`` (admin token, API-key
file, direct mode) and sim workers under ``infera-run worker`` with
``--restart-engine on-failure``. Each scenario is one ``async def`` decorated with
:func:`scenario` that returns a :class:`Row`: what was tried, what the client saw, what
was lost. After every scenario the runner checks that nothing else was lost: a burst of
ordinary requests all answer 200 and the router's in-flight counts return to zero.
To add a scenario, write one more function below.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos_stack import (
    KEY,
    LIMITED_KEY,
    MODEL,
    SLOW_KEY,
    ChaosStack,
    FakeWorker,
    wait_until,
)

from infera_core.worker import WorkerRecord

OK_BURST = 8


@dataclass(slots=True)
class Row:
    tried: str
    sees: str
    lost: str = "nothing"
    ok: bool = True


Scenario = Callable[[ChaosStack], Awaitable[Row]]
SCENARIOS: dict[str, tuple[Scenario, bool]] = {}


def scenario(*, fast: bool) -> Callable[[Scenario], Scenario]:
    """Register a scenario; ``fast`` ones (a few seconds) run in ``--fast`` and the smoke test."""

    def add(fn: Scenario) -> Scenario:
        SCENARIOS[fn.__name__] = (fn, fast)
        return fn

    return add


def _codes(codes: list[int]) -> str:
    return ", ".join(f"{n}×{code or 'no answer'}" for code, n in sorted(Counter(codes).items()))


def _err(r: httpx.Response) -> str:
    try:
        kind = r.json()["error"]["type"]
    except (ValueError, KeyError, TypeError):
        kind = ""
    return f"{r.status_code} {kind}".strip()


async def _raw(stack: ChaosStack) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", stack.port)


async def _closed_within(reader: asyncio.StreamReader, within: float) -> tuple[float | None, bytes]:
    """Seconds until the router closed the connection (None: still open), and what it sent."""
    t0 = time.monotonic()
    got = b""
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(within):
            while chunk := await reader.read(65536):
                got += chunk
            return time.monotonic() - t0, got
    return None, got


def _status_line(got: bytes) -> str:
    return got.split(b"\r\n", 1)[0].decode(errors="replace") if got else "nothing"


# -- hostile clients ------------------------------------------------------------------------
@scenario(fast=False)
async def idle_connections(stack: ChaosStack) -> Row:
    conns = [await _raw(stack) for _ in range(200)]
    waits = await asyncio.gather(*(_closed_within(r, 90) for r, _ in conns))
    for _, w in conns:
        w.close()
    closed = [t for t, _ in waits if t is not None]
    worst = f"{max(closed):.0f} s" if closed else "-"
    ok = len(closed) == len(conns)
    return Row(
        "200 connections opened and never used",
        f"{len(closed)}/200 closed by the router (last after {worst})",
        ok=ok,
    )


@scenario(fast=False)
async def slowloris(stack: ChaosStack) -> Row:
    reader, writer = await _raw(stack)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    t0 = time.monotonic()
    closed = None
    got = b""
    with contextlib.suppress(ConnectionError):
        while time.monotonic() - t0 < 30:
            writer.write(b"X-Slow-" + str(int((time.monotonic() - t0) * 20)).encode() + b": a\r\n")
            await writer.drain()
            t, got = await _closed_within(reader, 0.05)
            if t is not None or got:
                closed = time.monotonic() - t0
                break
    if closed is None:
        t, got = await _closed_within(reader, 1)
        closed = None if t is None else time.monotonic() - t0
    writer.close()
    sees = f"{_status_line(got)}; closed after {closed:.0f} s" if closed else "never closed within 30 s"
    return Row("slowloris: one header line every 50 ms", sees, ok=closed is not None)


@scenario(fast=True)
async def huge_headers(stack: ChaosStack) -> Row:
    reader, writer = await _raw(stack)
    rss0 = stack.router_rss_mb()
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    with contextlib.suppress(ConnectionError):
        for i in range(20 * 1024):  # 20 MB in 1 KiB header lines
            writer.write(b"X-Big-%d: %s\r\n" % (i, b"a" * 1000))
            if i % 256 == 0:
                await writer.drain()
        writer.write(b"\r\n")
        await writer.drain()
    _, got = await _closed_within(reader, 15)
    writer.close()
    grew = stack.router_rss_mb() - rss0
    ok = b" 431 " in got[:20] or not got
    return Row("20 MB of headers on one request", f"{_status_line(got)}; router RSS +{grew:.0f} MB", ok=ok)


def _many_messages(model: str, n: int = 2_500_000) -> bytes:
    return b'{"model":"%s","messages":[' % model.encode() + b",".join([b'{"a":"bcde"}'] * n) + b"]}"


async def _health_ms(stack: ChaosStack, stop: asyncio.Event) -> float:
    worst = 0.0
    while not stop.is_set():
        t0 = time.monotonic()
        with contextlib.suppress(httpx.HTTPError):
            await stack.client.get(f"{stack.root}/health", timeout=10)
        worst = max(worst, (time.monotonic() - t0) * 1000)
        await asyncio.sleep(0.02)
    return worst


@scenario(fast=False)
async def huge_body(stack: ChaosStack) -> Row:
    url = f"{stack.root}/v1/chat/completions"
    hdrs = stack.headers() | {"Content-Type": "application/json"}
    rss0 = stack.router_rss_mb()
    unknown = _many_messages("no-such-model")
    t0 = time.monotonic()
    r = await stack.client.post(url, content=unknown, headers=hdrs, timeout=120)
    first = f"{_err(r)} after {time.monotonic() - t0:.1f} s"
    body = _many_messages(MODEL)
    stop = asyncio.Event()
    probe = asyncio.create_task(_health_ms(stack, stop))
    rs = await asyncio.gather(
        *(stack.client.post(url, content=body, headers=hdrs, timeout=120) for _ in range(3)),
        return_exceptions=True,
    )
    stop.set()
    worst = await probe
    grew = stack.router_rss_mb() - rss0
    codes = [x.status_code if isinstance(x, httpx.Response) else 0 for x in rs]
    sees = f"unknown model: {first}; ×3 valid model: {_codes(codes)}, /health worst {worst:.0f} ms"
    ok = all(c in (400, 413) for c in codes) and r.status_code in (400, 404, 413)
    return Row(
        f"a {len(body) / 2**20:.0f} MB body of 2.5 M tiny messages",
        sees,
        f"nothing; router RSS +{grew:.0f} MB",
        ok,
    )


@scenario(fast=True)
async def deep_json(stack: ChaosStack) -> Row:
    depth = 100_000
    nested = "[" * depth + "]" * depth
    body = f'{{"model":"{MODEL}","messages":[{{"role":"user","content":"x"}}],"x":{nested}}}'
    r = await stack.client.post(
        f"{stack.root}/v1/chat/completions",
        content=body,
        headers=stack.headers() | {"Content-Type": "application/json"},
    )
    traceback = "Traceback" in stack.log_text("serve")
    ok = r.status_code == 400 and not traceback
    return Row(
        f"JSON nested {depth:,} deep", _err(r) + ("; a traceback in the log" if traceback else ""), ok=ok
    )


async def _picks(stack: ChaosStack) -> int:
    return sum(int(w.get("picks") or 0) for w in await stack.fleet())


@scenario(fast=True)
async def disconnect_during_body(stack: ChaosStack) -> Row:
    picks = await _picks(stack)
    _, writer = await _raw(stack)
    total = 14 * 2**20
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n" % (KEY.encode(), total)
    )
    writer.write(b'{"model":"%s","messages":[' % MODEL.encode() + b'{"role":"user","content":"x"},' * 200_000)
    with contextlib.suppress(ConnectionError):
        await writer.drain()
    writer.transport.abort()
    settled = await stack.settled()
    dispatched = await _picks(stack) - picks
    ok = settled and dispatched == 0
    lost = "nothing" if ok else f"{dispatched} dispatched; in-flight settled: {settled}"
    return Row(
        "client disconnects half-way through a 14 MB body",
        "(gone) — nothing dispatched" if ok else "dispatched",
        lost,
        ok,
    )


async def _engines_running(stack: ChaosStack) -> int:
    total = 0
    for w in await stack.fleet():
        with contextlib.suppress(httpx.HTTPError):
            text = (await stack.client.get(f"{w['url']}/metrics", timeout=5)).text
            total += sum(
                int(float(line.split()[-1]))
                for line in text.splitlines()
                if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
            )
    return total


@scenario(fast=True)
async def disconnect_before_first_byte(stack: ChaosStack) -> Row:
    for _ in range(5):
        with contextlib.suppress(httpx.TimeoutException):
            await stack.chat(within=0.3, max_tokens=4000, ignore_eos=True)

    async def idle() -> bool:
        return await _engines_running(stack) == 0

    freed = await wait_until(idle, 20)
    settled = await stack.settled()
    ok = freed is not None and settled
    sees = "(gone)" + (
        f"; engines stopped generating {freed:.1f} s later"
        if freed is not None
        else "; engines kept generating"
    )
    return Row(
        "5 non-streaming clients disconnect before the first byte",
        sees,
        "nothing" if ok else "engine work / accounting leaked",
        ok,
    )


# -- keys, admin, ids -----------------------------------------------------------------------------
@scenario(fast=True)
async def api_keys(stack: ChaosStack) -> Row:
    if "--api-key-file" not in stack.serve_flags:
        return Row("requests without / with a wrong API key", "no --api-key-file in this build", "-", False)
    none = (await stack.chat(key=None)).status_code
    wrong = (await stack.chat(key="sk-wrong")).status_code
    limited = (await stack.chat(key=LIMITED_KEY)).status_code
    rpm = [(await stack.chat(key=SLOW_KEY)).status_code for _ in range(3)]
    sees = f"none {none}, wrong {wrong}, model not allowed {limited}, 3rd request of a 2/min key {rpm[-1]}"
    ok = (none, wrong, limited, rpm[-1]) == (401, 401, 403, 429)
    return Row("no key, a wrong key, a disallowed model, over requests/minute", sees, ok=ok)


@scenario(fast=True)
async def admin_surface(stack: ChaosStack) -> Row:
    bad = await stack.client.get(f"{stack.root}/v1/workers", headers={"Authorization": "Bearer nope"})
    key = await stack.client.get(f"{stack.root}/v1/workers", headers=stack.headers())
    direct = await stack.client.post(
        f"{stack.root}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
        headers=stack.headers(**{"x-worker-instance-id": "sim-1"}),
    )
    sees = f"/v1/workers with a wrong token {bad.status_code}, with a client key {key.status_code}; direct mode with a client key {direct.status_code}"
    ok = bad.status_code in (401, 403) and key.status_code in (401, 403) and direct.status_code in (401, 403)
    return Row("GET /v1/workers and x-worker-instance-id without the admin token", sees, ok=ok)


@scenario(fast=True)
async def credentials_in_worker_url(stack: ChaosStack) -> Row:
    async with FakeWorker("chaos-cred") as fake:
        url = fake.url.replace("http://", "http://admin:hunter2@")
        key = await stack.register_fake(fake, "fake-cred", "chaos-cred", url=url)
        try:

            async def listed() -> bool:
                return any(w["worker_id"] == "fake-cred" for w in await stack.fleet())

            await wait_until(listed, 10)
            text = (await stack.client.get(f"{stack.root}/v1/workers", headers=stack.admin())).text
            r = await stack.chat(model="chaos-cred")
        finally:
            await stack.etcd_delete(key)
    leaked = "hunter2" in text or "hunter2" in stack.log_text("serve")
    sees = (
        f"/v1/workers shows the URL {'with' if leaked else 'without'} its password; request {r.status_code}"
    )
    return Row(
        "a worker URL with credentials (http://admin:hunter2@…)",
        sees,
        "the password" if leaked else "nothing",
        not leaked,
    )


@scenario(fast=True)
async def same_request_id(stack: ChaosStack) -> Row:
    async def one() -> httpx.Response:
        return await stack.client.post(
            f"{stack.root}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "same id"}], "max_tokens": 8},
            headers=stack.headers(**{"X-Request-Id": "chaos-same-id"}),
        )

    rs = await asyncio.gather(*(one() for _ in range(4)))
    ids = {r.json().get("id") for r in rs if r.status_code == 200}
    echoed = all(r.headers.get("x-request-id") == "chaos-same-id" for r in rs)
    ok = all(r.status_code == 200 for r in rs) and len(ids) == 4
    sees = f"{_codes([r.status_code for r in rs])}, {len(ids)} distinct response ids, header echoed: {echoed}"
    return Row("4 concurrent requests with one client X-Request-Id", sees, ok=ok)


# -- faulty workers -------------------------------------------------------------------------------
@scenario(fast=False)
async def hung_worker(stack: ChaosStack) -> Row:
    stack.add_worker("sim-hung", "--fault-hang")
    n = stack.n_workers + 1
    await stack.wait_active(n, 120)
    t0 = time.monotonic()
    codes = await stack.burst(24, concurrency=4)
    lat = time.monotonic() - t0

    async def out() -> bool:
        return not any(w["worker_id"] == "sim-hung" and w["status"] == "active" for w in await stack.fleet())

    left = await wait_until(out, 60)
    stack.stop_worker("sim-hung", fast=True)
    sees = (
        f"{_codes(codes)} in {lat:.0f} s; the hung worker left rotation after {left + lat:.0f} s"
        if left is not None
        else f"{_codes(codes)}; the hung worker stayed in rotation"
    )
    ok = all(c == 200 for c in codes) and left is not None and left + lat < 60
    return Row("a worker that accepts requests and never answers (sim --fault-hang)", sees, ok=ok)


@scenario(fast=False)
async def erroring_worker(stack: ChaosStack) -> Row:
    stack.add_worker("sim-err", "--fault-error-rate", "1", "--fault-error-status", "500")
    await stack.wait_active(stack.n_workers + 1, 120)
    codes = await stack.burst(30, concurrency=4)
    stack.stop_worker("sim-err", fast=True)
    ok = all(c == 200 for c in codes)
    return Row(
        "a worker answering 500 to every request", _codes(codes), "nothing" if ok else "the 5xx above", ok
    )


async def _with_traffic(stack: ChaosStack, fault: Callable[[], Awaitable[object]], n: int = 40) -> list[int]:
    traffic = asyncio.create_task(stack.burst(n, concurrency=2))
    await asyncio.sleep(0.5)
    await fault()
    return await traffic


@scenario(fast=True)
async def killed_engine(stack: ChaosStack) -> Row:
    pid = await stack.engine_pid("sim-1")

    async def kill() -> None:
        import os
        import signal

        assert pid is not None
        os.kill(pid, signal.SIGKILL)

    t0 = time.monotonic()
    codes = await _with_traffic(stack, kill)

    async def restarted() -> bool:
        new = await stack.engine_pid("sim-1")
        return new is not None and new != pid and await stack.active() == stack.n_workers

    back = await wait_until(restarted, 60)
    ok = all(c == 200 for c in codes) and back is not None
    again = f"served again after {time.monotonic() - t0:.0f} s" if back is not None else "did not come back"
    sees = f"{_codes(codes)}; the worker {again}"
    return Row("one engine killed with -9 (launcher --restart-engine on-failure)", sees, ok=ok)


@scenario(fast=True)
async def worker_sigterm(stack: ChaosStack) -> Row:
    async def term() -> None:
        stack.stop_worker("sim-2")

    codes = await _with_traffic(stack, term)
    stack.add_worker("sim-2")
    back = await stack.wait_active(stack.n_workers, 120)
    ok = all(c == 200 for c in codes) and back is not None
    return Row("a worker stopped with SIGTERM mid-traffic (drain)", _codes(codes), ok=ok)


@scenario(fast=True)
async def extra_bytes_after_response(stack: ChaosStack) -> Row:
    async with FakeWorker("chaos-junk", junk=b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\njunk") as fake:
        key = await stack.register_fake(fake, "fake-junk", "chaos-junk")
        try:

            async def listed() -> bool:
                return any(w["worker_id"] == "fake-junk" for w in await stack.fleet())

            await wait_until(listed, 10)
            codes = [(await stack.chat(model="chaos-junk")).status_code for _ in range(6)]
        finally:
            await stack.etcd_delete(key)
    ok = all(c == 200 for c in codes)
    return Row("a worker writes extra bytes after each complete response", _codes(codes), ok=ok)


@scenario(fast=True)
async def ghost_record(stack: ChaosStack) -> Row:
    async with FakeWorker(MODEL) as fake:
        key = "/infera/workers/ghost-in-key"
        bad = WorkerRecord(worker_id="ghost-in-record", url=fake.url, model=MODEL, engine="fake")
        await stack.etcd_put(key, bad.model_dump_json())  # a record whose worker_id differs from its key
        await asyncio.sleep(1.0)
        seen = {w["worker_id"] for w in await stack.fleet()} & {"ghost-in-key", "ghost-in-record"}
        await stack.etcd_delete(key)

        async def gone() -> bool:
            return not ({w["worker_id"] for w in await stack.fleet()} & {"ghost-in-key", "ghost-in-record"})

        removed = await wait_until(gone, 10)
    ok = removed is not None and "ghost-in-record" not in seen
    sees = f"while present the router listed {sorted(seen) or 'nothing'}; after the delete: {'gone' if removed is not None else 'still listed'}"
    return Row("an etcd record whose worker_id differs from its key, then the key deleted", sees, ok=ok)


# -- KV events ---------------------------------------------------------------------------------
async def _metric(stack: ChaosStack, name: str, worker: str) -> float:
    text = (await stack.client.get(f"{stack.root}/metrics", headers=stack.admin())).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name) and f'worker="{worker}"' in line
    )


@scenario(fast=True)
async def kv_bad_frames(stack: ChaosStack) -> Row:
    import msgspec

    payload = msgspec.msgpack.encode([time.time(), [], None])
    async with FakeWorker("chaos-kv", kv=True) as fake:
        key = await stack.register_fake(fake, "fake-kv", "chaos-kv")
        try:
            seq = 0

            async def connected() -> bool:
                nonlocal seq
                fake.publish(b"kv-events", seq.to_bytes(8, "big"), payload)
                seq += 1
                return await _metric(stack, "infera_kv_batches", "fake-kv") > 0

            joined = await wait_until(connected, 15, step=0.2)
            rss0 = stack.router_rss_mb()
            fake.publish(b"kv-events", (-5).to_bytes(8, "big", signed=True), payload)
            fake.publish(b"kv-events", (1).to_bytes(11, "big"), payload)
            fake.publish(b"kv-events", seq.to_bytes(8, "big"), b"\x93\xcb" + b"\x00" * 60 * 2**20)
            await asyncio.sleep(1.0)
            seq += 1
            before = await _metric(stack, "infera_kv_batches", "fake-kv")

            async def flowing() -> bool:
                nonlocal seq
                fake.publish(b"kv-events", seq.to_bytes(8, "big"), payload)
                seq += 1
                return await _metric(stack, "infera_kv_batches", "fake-kv") > before

            still = await wait_until(flowing, 15, step=0.2)
            grew = stack.router_rss_mb() - rss0
            codes = await stack.burst(6)
        finally:
            await stack.etcd_delete(key)
    ok = joined is not None and still is not None and grew < 100 and all(c == 200 for c in codes)
    sees = f"router kept serving ({_codes(codes)}); later batches {'still applied' if still is not None else 'no longer read'}"
    return Row(
        "ZMQ KV frames: negative seq, 11-byte seq, a 60 MB frame",
        sees,
        f"nothing; router RSS +{grew:.0f} MB",
        ok,
    )


# -- the registry -------------------------------------------------------------------------------
@scenario(fast=False)
async def etcd_down(stack: ChaosStack) -> Row:
    await asyncio.to_thread(stack.etcd.stop)
    codes = await stack.burst(20, concurrency=2)
    await asyncio.to_thread(stack.etcd.start)
    back = await stack.wait_active(stack.n_workers, 60)
    ok = all(c == 200 for c in codes) and back is not None
    return Row(
        "etcd stopped, 20 requests, etcd started again",
        f"{_codes(codes)}; fleet intact after the restart: {back is not None}",
        ok=ok,
    )


# -- the runner --------------------------------------------------------------------------------
async def intact(stack: ChaosStack) -> str | None:
    """What ordinary traffic lost after a scenario (None: nothing)."""
    await stack.wait_active(stack.n_workers, 60)
    codes = await stack.burst(OK_BURST)
    problems = []
    if any(c != 200 for c in codes):
        problems.append(f"ordinary requests after it: {_codes(codes)}")
    if not await stack.settled():
        problems.append("in-flight counts did not return to 0")
    return "; ".join(problems) or None


async def run_scenario(stack: ChaosStack, name: str, limit: float = 240) -> Row:
    fn, _ = SCENARIOS[name]
    try:
        async with asyncio.timeout(limit):
            row = await fn(stack)
    except Exception as exc:  # a scenario that breaks is a row too
        row = Row(name, f"scenario error: {type(exc).__name__}: {exc}"[:200], "?", False)
    after = await intact(stack)
    if after:
        row.lost = after if row.lost == "nothing" else f"{row.lost}; {after}"
        row.ok = False
    return row


def table(rows: list[Row]) -> str:
    lines = ["| what was tried | what the client sees | what is lost |", "|---|---|---|"]
    for r in rows:
        mark = "" if r.ok else " ⚠"
        lines.append(f"| {r.tried} | {r.sees}{mark} | {r.lost} |")
    return "\n".join(lines)


async def main(names: list[str], workers: int) -> list[Row]:
    rows = []
    async with ChaosStack(workers=workers) as stack:
        for name in names:
            t0 = time.monotonic()
            row = await run_scenario(stack, name)
            print(
                f"  {name}: {'ok' if row.ok else 'NOT OK'} ({time.monotonic() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            rows.append(row)
    return rows


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated scenario names")
    p.add_argument("--fast", action="store_true", help="only the quick scenarios")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path, help="also write the Markdown table here")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    a = p.parse_args(argv)
    if a.list:
        for name, (fn, fast) in SCENARIOS.items():
            print(f"{name}{' (fast)' if fast else ''}: {(fn.__doc__ or '').strip()}")
        return 0
    names = [n for n, (_, fast) in SCENARIOS.items() if fast or not a.fast]
    if a.only:
        names = [n.strip() for n in a.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in SCENARIOS]
        if unknown:
            p.error(f"unknown scenario(s) {', '.join(unknown)}; see --list")
    rows = asyncio.run(main(names, a.workers))
    text = table(rows)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    bad = sum(not r.ok for r in rows)
    print(f"\n{len(rows) - bad}/{len(rows)} scenarios lost nothing", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(cli())

"""Chaos scenarios: hostile clients, API keys, the admin surface, request ids (see ``run.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx

from bench.chaos.stack import (
    KEY,
    LIMITED_KEY,
    MODEL,
    SLOW_KEY,
    ChaosStack,
    FakeWorker,
    Row,
    codes_text,
    error_text,
    scenario,
    wait_until,
)


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
    return Row("20 MB of headers on one request", f"{_status_line(got)}; router RSS {grew:+.0f} MB", ok=ok)


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
    first = f"{error_text(r)} after {time.monotonic() - t0:.1f} s"
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
    sees = f"unknown model: {first}; ×3 valid model: {codes_text(codes)}, /health worst {worst:.0f} ms"
    ok = all(c in (400, 413) for c in codes) and r.status_code in (400, 404, 413)
    return Row(
        f"a {len(body) / 2**20:.0f} MB body of 2.5 M tiny messages",
        sees,
        f"nothing; router RSS {grew:+.0f} MB",
        ok,
    )


@scenario(fast=True)
async def deep_json(stack: ChaosStack) -> Row:
    depth = 100_000
    nested = "[" * depth + "]" * depth
    deep_input = '{"a":' * depth + "1" + "}" * depth
    chat = f'{{"model":"{MODEL}","messages":[{{"role":"user","content":"x"}}],"x":{nested}}}'
    tool_use = f'{{"type":"tool_use","id":"t1","name":"f","input":{deep_input}}}'
    messages = (
        f'{{"model":"{MODEL}","max_tokens":4,"messages":[{{"role":"assistant","content":[{tool_use}]}}]}}'
    )
    hdrs = stack.headers() | {"Content-Type": "application/json"}
    got = []
    for path, body in (("/v1/chat/completions", chat), ("/v1/messages", messages)):
        r = await stack.client.post(f"{stack.root}{path}", content=body, headers=hdrs)
        got.append((path, r))
    traceback = "Traceback" in stack.log_text("serve")
    ok = all(r.status_code == 400 for _, r in got) and not traceback
    sees = "; ".join(f"{path}: {error_text(r)}" for path, r in got)
    return Row(
        f"JSON nested {depth:,} deep (chat; tool_use.input on /v1/messages)",
        sees + ("; a traceback in the log" if traceback else ""),
        ok=ok,
    )


async def _picks(stack: ChaosStack) -> int:
    return sum(int(w.get("picks") or 0) for w in await stack.fleet())


async def _slow_body(stack: ChaosStack, trickle: bool) -> tuple[float | None, bytes]:
    """Complete headers, then the body one byte a second (``trickle``) or ten bytes and nothing."""
    reader, writer = await _raw(stack)
    body = b'{"model":"%s","messages":[{"role":"user","content":"%s"}]}' % (MODEL.encode(), b"x" * 200)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s" % (KEY.encode(), len(body), body[:10])
    )
    t0 = time.monotonic()
    got = b""
    with contextlib.suppress(ConnectionError):
        for byte in body[10:] if trickle else b"":
            t, got = await _closed_within(reader, 1.0)
            if t is not None or got:
                break
            writer.write(bytes([byte]))
            await writer.drain()
        else:
            _, got = await _closed_within(reader, 90)
    if not got:
        _, got = await _closed_within(reader, 5)
    closed = time.monotonic() - t0 if got or reader.at_eof() else None
    writer.close()
    return closed, got


@scenario(fast=False)
async def slow_body(stack: ChaosStack) -> Row:
    """Complete headers, then a body that stops, and one trickled a byte a second (default limits)."""
    picks = await _picks(stack)
    (stop_t, stop), (trickle_t, trickle) = await asyncio.gather(
        _slow_body(stack, False), _slow_body(stack, True)
    )
    dispatched = await _picks(stack) - picks
    settled = await stack.settled()

    def seen(t: float | None, got: bytes) -> str:
        return f"{_status_line(got)} after {t:.0f} s, closed" if t is not None else "still open after 90 s"

    ok = b" 408 " in stop[:20] and b" 408 " in trickle[:20] and dispatched == 0 and settled
    return Row(
        "a body that stops after 10 bytes; a body trickled 1 byte/s (headers complete)",
        f"stops: {seen(stop_t, stop)}; trickled: {seen(trickle_t, trickle)}",
        "nothing (nothing dispatched)" if dispatched == 0 and settled else f"{dispatched} dispatched",
        ok,
    )


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


async def engines_running(stack: ChaosStack) -> int:
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
        return await engines_running(stack) == 0

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
    sees = f"{codes_text([r.status_code for r in rs])}, {len(ids)} distinct response ids, header echoed: {echoed}"
    return Row("4 concurrent requests with one client X-Request-Id", sees, ok=ok)


@scenario(fast=True)
async def malformed_bodies(stack: ChaosStack) -> Row:
    """Bodies that are not what the API expects: every one a 4xx, none a 5xx."""
    m = MODEL.encode()
    user = b'[{"role": "user", "content": "x"}]'
    bodies = {
        "empty": b"",
        "not JSON": b"not json",
        "an array": b"[1, 2, 3]",
        "a string": b'"a string"',
        "{}": b"{}",
        "model a number": b'{"model": 5, "messages": []}',
        "messages a string": b'{"model": "%s", "messages": "hi"}' % m,
        "max_tokens -1": b'{"model": "%s", "messages": %s, "max_tokens": -1}' % (m, user),
        "max_tokens 1e999": b'{"model": "%s", "messages": %s, "max_tokens": 1e999}' % (m, user),
        "n = 10^23": b'{"model": "%s", "messages": %s, "n": 99999999999999999999999}' % (m, user),
        "invalid UTF-8": b'{"model": "\xff\xfe", "messages": []}',
        "a lone surrogate": b'{"model": "%s", "messages": [{"role": "user", "content": "\\ud800"}]}' % m,
        "a 100 kB model name": b'{"model": "' + b"m" * 100_000 + b'", "messages": []}',
    }
    hdrs = stack.headers() | {"Content-Type": "application/json"}
    codes = []
    worst = []
    for path in ("/v1/chat/completions", "/v1/completions"):
        for label, body in bodies.items():
            code = (await stack.client.post(f"{stack.root}{path}", content=body, headers=hdrs)).status_code
            codes.append(code)
            if code >= 500:
                worst.append(f"{code} for {label} on {path}")
    traceback = "Traceback" in stack.log_text("serve")
    ok = not worst and not traceback
    sees = codes_text(codes) + "".join(f"; {w}" for w in worst)
    lost = "nothing" if ok else "a worker out of rotation per 5xx above (the engine wedged on the body)"
    return Row(f"{len(codes)} malformed bodies on /v1/chat/completions and /v1/completions", sees, lost, ok)


@scenario(fast=True)
async def stream_disconnect(stack: ChaosStack) -> Row:
    """Streaming clients that leave after the first chunk: the engines stop generating."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 4000,
        "stream": True,
        "ignore_eos": True,
    }
    for _ in range(4):
        url = f"{stack.root}/v1/chat/completions"
        async with stack.client.stream("POST", url, json=body, headers=stack.headers()) as r:
            async for _chunk in r.aiter_bytes():
                break

    async def idle() -> bool:
        return await engines_running(stack) == 0

    freed = await wait_until(idle, 20)
    ok = freed is not None and await stack.settled()
    sees = "(gone)" + (
        f"; engines stopped generating {freed:.1f} s later"
        if freed is not None
        else "; engines kept generating"
    )
    return Row(
        "4 streaming clients leave after the first chunk", sees, "nothing" if ok else "engine work leaked", ok
    )


@scenario(fast=True)
async def pool_at_cap(stack: ChaosStack) -> Row:
    """More concurrent requests than upstream connections: the excess waits --pool-timeout, then 503."""
    if "--pool-timeout" not in stack.serve_flags:
        return Row(
            "requests waiting for an upstream connection at the cap",
            "no --pool-timeout in this build",
            "-",
            False,
        )
    async with stack.second_router("--upstream-connections", "2", "--pool-timeout", "1") as root:

        async def one() -> tuple[int, float]:
            t0 = time.monotonic()
            try:
                r = await stack.chat(root=root, within=30, max_tokens=1500, ignore_eos=True)
                return r.status_code, time.monotonic() - t0
            except httpx.HTTPError:
                return 0, time.monotonic() - t0

        results = await asyncio.gather(*(one() for _ in range(6)))
    codes = [c for c, _ in results]
    waited = max((t for c, t in results if c != 200), default=0.0)
    ok = 200 in codes and set(codes) <= {200, 503} and waited < 10
    sees = f"{codes_text(codes)}; the 503s after {waited:.1f} s (--upstream-connections 2 --pool-timeout 1)"
    return Row("6 concurrent requests through a router allowed 2 upstream connections", sees, ok=ok)

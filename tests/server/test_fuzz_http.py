"""Fuzz the hot routes and the HTTP layer with hypothesis: no 5xx and no traceback for any input.

The server runs in a thread (its own event loop) with two stand-in workers; hypothesis
drives a blocking client. Each test reports how many inputs it tried.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infera_core.testing.threaded import ThreadedServer, report_line, served_in_thread

ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/messages"]
FUZZ = settings(
    max_examples=250,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
tried: dict[str, int] = {}


@pytest.fixture(scope="module")
def srv(request: pytest.FixtureRequest) -> Iterator[ThreadedServer]:
    with served_in_thread(workers=2, max_json_depth=16, header_timeout=2.0) as server:
        yield server
    report_line(request, "fuzz (hypothesis): " + ", ".join(f"{name} {n} inputs" for name, n in tried.items()))
    assert not server.errors, server.errors[:3]


@pytest.fixture(scope="module")
def client(srv: ThreadedServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=20) as c:
        yield c


def _count(name: str) -> None:
    tried[name] = tried.get(name, 0) + 1


scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=25,
)
deep = st.integers(min_value=10, max_value=3000).map(lambda n: "[" * n + "]" * n)
roles = st.sampled_from(["user", "system", "assistant", "tool", "developer"]) | json_values
content_blocks = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image", "tool_use", "tool_result"]) | json_values},
        optional={
            "text": json_values,
            "id": json_values,
            "name": json_values,
            "input": json_values,
            "content": json_values,
            "tool_use_id": json_values,
            "source": json_values,
        },
    ),
    max_size=3,
)
messages = st.lists(
    st.fixed_dictionaries({"role": roles}, optional={"content": st.text() | content_blocks | json_values}),
    max_size=4,
)


def request_bodies(model: str) -> st.SearchStrategy[Any]:
    """Bodies close to valid ones (each field sometimes any JSON) and plain random JSON."""
    near = st.fixed_dictionaries(
        {"model": st.just(model) | json_values},
        optional={
            "messages": messages | json_values,
            "prompt": st.text() | st.lists(st.integers()) | json_values,
            "max_tokens": st.integers() | json_values,
            "stream": st.booleans() | json_values,
            "stream_options": json_values,
            "system": st.text() | content_blocks | json_values,
            "tools": json_values,
            "tool_choice": json_values,
            "stop": json_values,
            "stop_sequences": json_values,
            "temperature": json_values,
        },
    )
    return near | json_values


def _check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        body = r.json()  # errors are JSON, OpenAI- or Anthropic-shaped
        assert "error" in body, body


@pytest.mark.slow
@given(data=st.data())
@FUZZ
def test_near_valid_and_random_json_bodies(
    srv: ThreadedServer, client: httpx.Client, data: st.DataObject
) -> None:
    route = data.draw(st.sampled_from(ROUTES))
    body = data.draw(request_bodies("fake-model"))
    _count("json bodies")
    _check(
        client.post(route, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    )


@given(route=st.sampled_from(ROUTES), raw=st.binary(max_size=300) | deep.map(str.encode))
@FUZZ
def test_random_bytes_bodies(srv: ThreadedServer, client: httpx.Client, route: str, raw: bytes) -> None:
    _count("byte bodies")
    _check(client.post(route, content=raw, headers={"content-type": "application/json"}))


header_names = st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=":"), min_size=1)
request_lines = st.sampled_from(
    [b"POST /v1/chat/completions HTTP/1.1", b"GET /health HTTP/1.1", b"GET /v1/models HTTP/1.0"]
) | st.binary(max_size=60)


@given(
    line=request_lines,
    headers=st.lists(st.tuples(header_names, st.binary(max_size=40)), max_size=5),
    tail=st.binary(max_size=80),
)
@FUZZ
def test_raw_http_requests(
    srv: ThreadedServer, line: bytes, headers: list[tuple[str, bytes]], tail: bytes
) -> None:
    _count("raw HTTP requests")
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    head = b"".join(
        name.encode() + b": " + value.replace(b"\r", b"").replace(b"\n", b"") + b"\r\n"
        for name, value in headers
    )
    payload = line + b"\r\nhost: x\r\n" + head + b"\r\n" + tail
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(payload)
        sock.settimeout(0.3)  # an incomplete request gets no answer: do not wait for one
        answer = _read_response(sock)
    if answer.startswith(b"HTTP/1."):
        status = int(answer.split(b" ", 2)[1])
        assert status < 500, answer[:300]
        assert b"content-type: application/json" in answer.lower(), answer[:300]


def _read_response(sock: socket.socket) -> bytes:
    """One response (headers + content-length body), or what came before EOF or a pause."""
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
            head, sep, body = answer.partition(b"\r\n\r\n")
            if sep:
                length = [
                    v
                    for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
                    if k.lower() == b"content-length"
                ]
                if length and len(body) >= int(length[0]):
                    break
    except (TimeoutError, ConnectionResetError):
        pass
    return answer

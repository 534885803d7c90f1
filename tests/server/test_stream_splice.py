"""Streams relayed from the worker connection's read callback (infera_core.server.splice):
every chunk arrives once and in order, also when the client stops reading for a while
(its transport pauses, the relay task takes over, then hands back), and a client's
``x-request-id`` (echoed on the response) keeps a stream on that path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator

import httpx
import pytest

from infera_core.server.splice import StreamTally
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for, until
from infera_core.testing.upstream import ScriptedUpstream
from infera_core.worker import WorkerRecord

EVENTS = 20000
PAD = "x" * 900


def _event(i: int) -> bytes:
    data = json.dumps({"choices": [{"index": 0, "delta": {"content": f"{i} {PAD}"}}]}).encode()
    return b"data: " + data + b"\n\n"


class BurstUpstream(ScriptedUpstream):
    """Streams ``EVENTS`` numbered events (~20 MB: more than the kernel buffers on the way hold) as fast as the router takes them."""

    def __init__(self, events: int = EVENTS) -> None:
        super().__init__(lambda conn, req: None)
        self.events = events
        self.writer: asyncio.StreamWriter | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.writers.add(writer)
        await self.read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for i in range(self.events):
            ev = _event(i)
            writer.write(b"%x\r\n%b\r\n" % (len(ev), ev))
            if i % 50 == 0:
                await asyncio.sleep(0)  # the router reads it in many pieces
        done = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(done), done))
        with contextlib.suppress(ConnectionError):
            await writer.drain()


@pytest.fixture
async def burst() -> AsyncIterator[BurstUpstream]:
    async with BurstUpstream() as up:
        yield up


@pytest.mark.parametrize("transport", ["native", "aiohttp"])
async def test_a_stream_the_client_stalls_arrives_whole_and_in_order(
    burst: BurstUpstream, transport: str
) -> None:
    async with serving(settings_for(http_client=transport), make_hooks()) as srv:
        srv.store.put(
            WorkerRecord(worker_id="b0", url=f"http://127.0.0.1:{burst.port}", model="m", engine="fake")
        )
        await srv.wait_workers(1)
        port = int(srv.url.rsplit(":", 1)[1])
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 14)  # a small window: fills soon
        sock.connect(("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        body = json.dumps({"model": "m", "prompt": "hi", "stream": True}).encode()
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%b" % (len(body), body)
        )
        await writer.drain()
        # the client reads nothing until every buffer on the way is full and the worker waits
        await until(
            lambda: burst.writer is not None and burst.writer.transport.get_write_buffer_size() > 0, within=30
        )
        received = bytearray()
        while not received.endswith(b"0\r\n\r\n"):
            chunk = await asyncio.wait_for(reader.read(1 << 16), 30)
            assert chunk, "the router closed the stream early"
            received += chunk
        data = bytes(received)
        writer.close()
    head, _, chunked = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    parts, at = [], 0
    while True:
        eol = chunked.index(b"\r\n", at)
        size = int(chunked[at:eol], 16)
        if size == 0:
            break
        parts.append(chunked[eol + 2 : eol + 2 + size])
        at = eol + 4 + size
    events = [e for e in b"".join(parts).split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    numbers = [int(json.loads(e[6:])["choices"][0]["delta"]["content"].split()[0]) for e in events[:-1]]
    assert numbers == list(range(EVENTS))


@pytest.mark.parametrize("request_id", [None, "trace-7"])
async def test_a_stream_is_written_from_the_read_callback_with_or_without_a_request_id(
    request_id: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    attached: list[bool] = []
    attach = StreamTally.attach

    def recording(self: StreamTally, send: object) -> bool:
        attached.append(attach(self, send))
        return attached[-1]

    monkeypatch.setattr(StreamTally, "attach", recording)
    headers = {"x-request-id": request_id} if request_id else {}
    async with (
        BurstUpstream(events=50) as up,
        serving(settings_for(), make_hooks()) as srv,
    ):
        srv.store.put(
            WorkerRecord(worker_id="b0", url=f"http://127.0.0.1:{up.port}", model="m", engine="fake")
        )
        await srv.wait_workers(1)
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
            body = {"model": "m", "prompt": "hi", "stream": True}
            r = await c.post("/v1/completions", json=body, headers=headers)
    assert r.status_code == 200
    assert r.headers.get("x-request-id") == request_id  # echoed when sent
    events = [e for e in r.text.split("\n\n") if e]
    assert len(events) == 51 and events[-1] == "data: [DONE]"
    assert attached == [True]  # the relay handed the stream to the read callback

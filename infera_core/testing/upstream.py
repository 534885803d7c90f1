"""A minimal, fast OpenAI-ish upstream on raw asyncio (tests and ``bench/router/proxy_overhead.py``).

HTTP/1.1 with keep-alive; ``POST`` anything → a chat/completion JSON body, or with
``"stream": true`` in the request an SSE stream of ``chunks`` events then
``[DONE]``. Behaviour knobs (``status``, ``chunk_delay``, ``die_after_chunks``,
``delay``, and the misbehaviours ``hang``, ``break_body`` and ``trailing``) can be changed while it runs. It records the last raw request body and
the number of requests it answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Self, cast

from infera_core.transports.http import make_upstream
from infera_core.transports.http.native import NativeUpstream

_DATA = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok "}}]}\n\n'


class _Conn(asyncio.Protocol):
    def __init__(self, up: FakeUpstream) -> None:
        self.up = up
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.up.connections.add(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.up.connections.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            end = head_end + 4 + length
            if len(self.buf) < end:
                return
            body = self.buf[head_end + 4 : end]
            self.buf = self.buf[end:]
            path = head.split(" ", 2)[1] if " " in head else "/"
            self.up.requests += 1
            self.up.last_body = body
            self.up.last_path = path
            task = asyncio.ensure_future(self.up.respond(self.transport, path, body))
            self.up.tasks.add(task)
            task.add_done_callback(self.up.tasks.discard)


class FakeUpstream:
    """Start with ``await up.start()``; ``up.url``; stop with ``await up.stop()``."""

    def __init__(self, name: str = "fake", model: str = "fake-model", chunks: int = 64) -> None:
        self.name = name
        self.model = model
        self.chunks = chunks
        self.status = 200
        self.delay = 0.0
        self.chunk_delay = 0.0
        self.die_after_chunks: int | None = None
        self.trailing = b""
        """Misbehaviour: bytes written right after each complete JSON response (a desynced worker)."""
        self.hang = False
        """Misbehaviour: accept requests and never answer them (like the sim's ``--fault-hang``)."""
        self.break_body = False
        """Misbehaviour: send a JSON answer's headers and half its body, then close (a worker
        dying while it answers a non-streamed request)."""
        self.requests = 0
        self.last_body = b""
        self.last_path = ""
        self.connections: set[asyncio.Transport] = set()
        self.tasks: set[asyncio.Future[None]] = set()
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._json = json.dumps(
            {
                "id": "cmpl-1",
                "object": "chat.completion",
                "model": model,
                "worker": name,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
            }
        ).encode()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Conn(self), "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for t in list(self.connections):
                t.abort()
            for task in list(self.tasks):
                task.cancel()
            await self._server.wait_closed()
            self._server = None

    async def respond(self, transport: asyncio.Transport | None, path: str, body: bytes) -> None:
        if transport is None:
            return
        if self.hang:
            await asyncio.Event().wait()  # until stop() closes the connection and cancels us
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.status != 200:
            err = json.dumps({"error": {"message": f"{self.name} fails with {self.status}"}}).encode()
            transport.write(_head(self.status, b"application/json", len(err)) + err)
            return
        if b'"stream":true' not in body.replace(b" ", b""):
            if self.break_body:
                head = _head(200, b"application/json", len(self._json))
                transport.write(head + self._json[: len(self._json) // 2])
                await asyncio.sleep(0)
                transport.abort()
                return
            transport.write(_head(200, b"application/json", len(self._json)) + self._json + self.trailing)
            return
        transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        frame = b"%x\r\n%s\r\n" % (len(_DATA), _DATA)
        for i in range(self.chunks):
            if self.die_after_chunks is not None and i >= self.die_after_chunks:
                transport.abort()
                return
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
            if transport.is_closing():
                return
            transport.write(frame)
        done = b"data: [DONE]\n\n"
        transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


def http_reply(status: int, body: bytes, content_type: bytes = b"application/json") -> bytes:
    """A complete HTTP/1.1 response with ``body`` (what a :class:`ScriptedUpstream` answers)."""
    return _head(status, content_type, len(body)) + body


def _head(status: int, ctype: bytes, length: int) -> bytes:
    reason = {
        200: b"OK",
        404: b"Not Found",
        429: b"Too Many Requests",
        500: b"Internal Server Error",
        503: b"Service Unavailable",
    }
    return b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (
        status,
        reason.get(status, b"Error"),
        ctype,
        length,
    )


def record_for(up: FakeUpstream, **extra: Any) -> Any:
    """A :class:`WorkerRecord` pointing at ``up``."""
    from infera_core.worker import WorkerRecord

    return WorkerRecord(worker_id=up.name, url=up.url, model=up.model, engine="fake", **extra)


@contextlib.asynccontextmanager
async def fake_upstreams(n: int, model: str = "fake-model") -> AsyncIterator[list[FakeUpstream]]:
    """``n`` started upstreams named ``w0``…; stopped when the block exits."""
    ups = [FakeUpstream(f"w{i}", model) for i in range(n)]
    try:
        for u in ups:
            await u.start()
        yield ups
    finally:
        for u in ups:
            await u.stop()


# what the scripted server answers: bytes, or None to close the connection without a byte
Answer = Callable[[int, int], bytes | None]


class LoopbackStreamServer:
    """Base of the raw asyncio servers on loopback here: tracks its connections' writers,
    ``async with`` starts it on a free port and closes every connection on exit.
    Subclasses answer a connection in :meth:`_serve`."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.port = 0
        self.writers: set[asyncio.StreamWriter] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Self:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for w in list(self.writers):
            w.close()


class ScriptedUpstream(LoopbackStreamServer):
    """A raw HTTP/1.1 server on loopback for transport edge cases: ``answer(connection_no,
    request_no_on_that_connection)`` returns the reply bytes, or None to close the connection
    without a byte; ``close_after_reply`` closes after every reply. ``async with`` starts it."""

    def __init__(self, answer: Answer, close_after_reply: bool = False) -> None:
        super().__init__()
        self.answer = answer
        self.close_after_reply = close_after_reply
        self.connections = 0
        self.requests = 0
        self.bodies: list[bytes] = []
        self.heads: list[bytes] = []
        """Each request's request line and headers, as received."""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn_no = self.connections
        self.connections += 1
        self.writers.add(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            for req_no in range(1_000_000):
                await self.read_request(reader)
                reply = self.answer(conn_no, req_no)
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
                if self.close_after_reply:
                    break
        writer.close()
        self.writers.discard(writer)

    async def read_request(self, reader: asyncio.StreamReader) -> None:
        """Read one request (its head and a ``content-length`` body) into :attr:`heads` and
        :attr:`bodies`."""
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        self.bodies.append(await reader.readexactly(length))
        self.requests += 1

    async def __aexit__(self, *exc: object) -> None:
        await super().__aexit__(*exc)
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def native_upstream(
    *,
    connect_timeout: float = 2.0,
    first_byte_timeout: float = 5.0,
    idle_timeout: float = 5.0,
    max_connections: int = 64,
    pool_timeout: float = 10.0,
) -> AsyncIterator[NativeUpstream]:
    """The router's native HTTP upstream client, started, with short test timeouts; closed after."""
    up = make_upstream(
        "native",
        connect_timeout=connect_timeout,
        first_byte_timeout=first_byte_timeout,
        idle_timeout=idle_timeout,
        max_connections=max_connections,
        pool_timeout=pool_timeout,
    )
    assert isinstance(up, NativeUpstream)
    await up.start()
    try:
        yield up
    finally:
        await up.close()

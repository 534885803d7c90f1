"""Small raw-ASGI helpers for the hot routes (no Request/Response objects per request)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from typing import Any, cast

from infera_core.server.errors import ApiError
from infera_core.server.validate import json_items, too_large, too_many_items

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ON_DISCONNECT = "infera.on_disconnect"
"""Scope key a server sets (to None) when it calls ``scope[ON_DISCONNECT]()`` on a client
disconnect before the response completed (``server.run``'s protocol does); without it the
endpoint watches ``receive()`` for ``http.disconnect`` in a task of its own."""

CLIENT_CLOSING = "infera.client_closing"
"""Scope key a server may set to a zero-argument callable: True once the client's connection
is closing (a disconnect already seen, before ``scope[ON_DISCONNECT]`` is called)."""

JSON_CT = (b"content-type", b"application/json")
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


_KEEP_BUFFER = 1 << 20
"""Bodies of at least this many bytes are returned as the ``bytearray`` they were read into."""


class ClientGone(Exception):
    """The client disconnected before its request body arrived."""


_SCAN: Any = object()


async def read_body(
    scope: Scope, receive: Receive, limit: int, max_items: int = 0, length: bytes | None = _SCAN
) -> bytes:
    """The whole request body; 413 when it is (or announces to be) over ``limit`` bytes or,
    with ``max_items``, holds more JSON items (counted per chunk as it arrives, so such a
    body is refused after its first megabyte or so: what the client still sends is read
    and dropped by the server, never stored; a caller passing ``max_items`` need not count
    again). A body of 1 MiB or more is the ``bytearray``
    it was read into (bytes-like everywhere it goes; not hashable, not to be mutated).
    ``length``: the request's first ``content-length`` header value (None: it has none)
    when the caller already looked; by default the headers are searched for it."""
    if length is _SCAN:
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
    if length is not None:
        try:
            if int(length) > limit:
                raise too_large(limit)
        except ValueError:
            raise ApiError(400, "Invalid Content-Length header.") from None
    msg = await receive()
    if msg["type"] != "http.request":
        raise ClientGone
    body: bytes = msg.get("body", b"")
    if not msg.get("more_body"):
        if len(body) > limit:
            raise too_large(limit)
        if max_items and len(body) > max_items and json_items(body) > max_items:
            raise too_many_items(max_items)
        return body
    buf = bytearray(body)
    items = json_items(body) if max_items else 0
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            raise ClientGone
        chunk = msg.get("body", b"")
        if len(buf) + len(chunk) > limit:
            raise too_large(limit)
        if max_items:
            items += json_items(chunk)
            if items > max_items:
                raise too_many_items(max_items)
        buf += chunk  # grown in place (a large block is remapped, not copied)
        if not msg.get("more_body"):
            # a large body stays the bytearray it was read into: copying it into bytes
            # would block the loop for tens of ms (every reader only reads it)
            return cast(bytes, buf) if len(buf) >= _KEEP_BUFFER else bytes(buf)


class ScopeHeaders(Mapping[str, str]):
    """The request headers as a read-only mapping, decoded only when first read."""

    __slots__ = ("_d", "_raw")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._raw = raw
        self._d: dict[str, str] | None = None

    def _dict(self) -> dict[str, str]:
        d = self._d
        if d is None:
            d = self._d = {k.decode("latin-1"): v.decode("latin-1") for k, v in self._raw}
        return d

    def __getitem__(self, key: str) -> str:
        return self._dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._dict().get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._raw)


def header_dict(scope: Scope) -> ScopeHeaders:
    return ScopeHeaders(scope["headers"])


def raw_header(scope: Scope, name: bytes) -> str | None:
    """One header (lower-case ``name``) without decoding the others."""
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


class EchoHeader:
    """A ``send`` that adds one header to the response start; ``inner`` is the server's own
    ``send`` (the stream relay writes around it once the response started)."""

    __slots__ = ("header", "inner")

    def __init__(self, inner: Send, name: bytes, value: bytes) -> None:
        self.inner = inner
        self.header = (name, value)

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), self.header]
        await self.inner(message)


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, err: ApiError, anthropic: bool = False) -> None:
    extra = [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    await send_bytes(send, err.status, err.anthropic_body() if anthropic else err.body(), extra=extra)

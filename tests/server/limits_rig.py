"""Shared rig of the limits tests: a router over fake upstreams, raw-socket helpers."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from infera_core.testing.server import RunningServer, serving_upstreams

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


stack = serving_upstreams


async def connect(srv: RunningServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def response(reader: asyncio.StreamReader, within: float = 5.0) -> tuple[int, dict[str, Any], bool]:
    """(status, JSON body, whether the server closed the connection after it)."""
    async with asyncio.timeout(within):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        body = await reader.readexactly(int(headers["content-length"]))
        try:
            closed = await reader.read(1) == b""
        except ConnectionResetError:  # closed while the client was still sending
            closed = True
    return int(lines[0].split()[1]), json.loads(body), closed


async def trickle(writer: asyncio.StreamWriter, data: bytes, answer: asyncio.Future[Any], gap: float) -> int:
    """Write ``data`` one byte every ``gap`` seconds until all is sent, ``answer`` is done or the
    server closes the connection: how many bytes were sent."""
    sent = 0
    with contextlib.suppress(ConnectionError):
        for byte in data:
            if answer.done():
                break
            writer.write(bytes([byte]))
            sent += 1
            await asyncio.sleep(gap)
    return sent


async def closed_within(reader: asyncio.StreamReader, within: float) -> bool:
    """Whether the server closes the connection within ``within`` seconds."""
    try:
        async with asyncio.timeout(within):
            await reader.read()  # whatever is left, then EOF
            return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True

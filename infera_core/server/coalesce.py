"""Coalesce an HTTP response's header block with its first body write.

uvicorn writes the status line and headers as soon as the app sends
``http.response.start`` and the body with the next message: two ``send()`` calls,
and with TCP_NODELAY two packets per response. This transport wrapper holds the
header block until the next write in the same event-loop tick (or flushes it on
the next tick), so a small JSON response leaves in one packet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class CoalescingTransport:
    """Wraps a server transport; everything but ``write``/``close`` passes through."""

    __slots__ = ("_held", "_loop", "_t", "linger")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._t = transport
        self._loop = loop
        self._held: bytes | None = None
        self.linger: Callable[[], bool] | None = None
        """Asked on :meth:`close`: True when the protocol closes lingering instead (the
        request's body is still arriving; see ``InferaHttpProtocol._linger``)."""

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._t.write(held + data)
        elif data[:5] == b"HTTP/" and data[-4:] == b"\r\n\r\n" and not data.startswith(b"HTTP/1.1 100 "):
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._t.write(data)

    def write_body(self, data: bytes) -> None:
        """``write`` for bytes known not to be a header block (a streamed body chunk)."""
        held = self._held
        if held is not None:
            self._held = None
            self._t.write(held + data)
        else:
            self._t.write(data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._t.is_closing():
                self._t.write(held)

    def writelines(self, lines: Any) -> None:
        self.write(b"".join(lines))

    def close(self) -> None:
        self.flush()
        linger = self.linger
        if linger is None or not linger():
            self._t.close()

    def is_closing(self) -> bool:
        return bool(self._t.is_closing())

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._t.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._t.pause_reading()

    def resume_reading(self) -> None:
        self._t.resume_reading()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)

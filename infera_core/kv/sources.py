"""The KV hub's router-side sources of non-ZMQ KV-event transports, one per transport.

Made on first use (the first worker whose record names the transport) and started
once; a source whose start failed is made again on the next use. The ``zmq`` transport
has no source here: the hub subscribes to engines' publishers itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from infera_core.config.backends import BackendOptions
from infera_core.errors import InferaError, UnknownNameError
from infera_core.kv.catalog import KvCatalog
from infera_core.transports.base import ZMQ, KvEventSource, KvSourceContext

log = logging.getLogger("infera.kv.sources")


class KvSources:
    """KV-event transport name → started :class:`KvEventSource`."""

    def __init__(self, catalog: KvCatalog, replay_timeout: float) -> None:
        self.catalog = catalog
        self.replay_timeout = replay_timeout
        self.options = BackendOptions()
        """Settings of KV-event transport plugins (the server hands its own)."""
        self.connect_timeout = 5.0
        """Seconds a source may take to reach its server (the server's ``--connect-timeout``)."""
        self._made: dict[str, asyncio.Future[KvEventSource | None]] = {}

    def installed(self, kind: str) -> bool:
        return kind == ZMQ or kind in self.catalog.kv_event_transports

    async def get(self, kind: str) -> KvEventSource:
        """The started source of ``kind``; raises when it cannot start (the caller retries)."""
        fut = self._made.get(kind)
        if fut is None or (fut.done() and (fut.cancelled() or fut.exception() is not None)):
            fut = self._made[kind] = asyncio.ensure_future(self._make(kind))
        source = await asyncio.shield(fut)
        if source is None:
            raise RuntimeError(f"KV-event transport {kind!r} has no router-side source")
        return source

    async def start(self, kind: str) -> None:
        """Start ``kind``'s source now (``serve --kv-event-transport``), so a server it cannot
        reach is one :class:`InferaError` line at start-up; nothing to do for ``zmq``."""
        if kind == ZMQ:
            return
        if not self.installed(kind):
            raise UnknownNameError("KV-event transport", kind, self.catalog.kv_event_transports.names())
        try:
            await self.get(kind)
        except InferaError:
            raise
        except Exception as exc:
            raise InferaError(
                f"--kv-event-transport {kind}: the KV event source did not start: {exc or type(exc).__name__}"
            ) from None

    async def _make(self, kind: str) -> KvEventSource | None:
        factory = self.catalog.kv_event_transports.get(kind)
        ctx = KvSourceContext(
            connect_timeout=self.connect_timeout, replay_timeout=self.replay_timeout, options=self.options
        )
        source: KvEventSource | None = factory.create_source(ctx)
        if source is not None:
            await source.start()
        return source

    async def close(self) -> None:
        made, self._made = list(self._made.values()), {}
        for fut in made:
            if not fut.done():
                fut.cancel()
                continue
            source = None if fut.cancelled() or fut.exception() is not None else fut.result()
            if source is not None:
                try:
                    await source.close()
                except Exception:
                    log.exception("KV event source %r failed to close", source)
        with contextlib.suppress(Exception):
            await asyncio.gather(*made, return_exceptions=True)

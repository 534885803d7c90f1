"""Run the server with uvicorn (uvloop + httptools, TCP_NODELAY on accepted sockets)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from infera_core.errors import InferaError
from infera_core.facade import InferaHooks
from infera_core.server.app import KvComponent, create_app, make_discovery
from infera_core.server.asgi import ON_DISCONNECT
from infera_core.server.coalesce import CoalescingTransport
from infera_core.server.settings import ServeSettings
from infera_core.server.transport import set_nodelay

log = logging.getLogger("infera.server")


class NoDelayHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with Nagle disabled on every accepted connection,
    each response's header block sent together with its first body bytes, and a client
    disconnect reported to the request's ``scope[ON_DISCONNECT]`` callback (no watcher
    task per request)."""

    def connection_made(self, transport: Any) -> None:
        set_nodelay(transport)
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[ON_DISCONNECT] = None  # type: ignore[literal-required]

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = getattr(self, "cycle", None)  # uvicorn's attribute; tolerate a rename
        if cycle is not None and not cycle.response_complete:
            hook: Callable[[], None] | None = cycle.scope.get(ON_DISCONNECT)
            if hook is not None:
                hook()
        super().connection_lost(exc)


def uvicorn_config(app: Any, settings: ServeSettings, log_level: str = "warning") -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=NoDelayHttpToolsProtocol,
        lifespan="on",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        log_level=log_level,
        timeout_keep_alive=30,
        backlog=4096,
    )


async def serve(settings: ServeSettings, hooks: InferaHooks, kv: KvComponent | None = None) -> None:
    """Start discovery (clear error if unreachable), then serve until SIGINT/SIGTERM."""
    discovery = make_discovery(settings, hooks)
    if kv is None:
        from infera_core.kv.component import make_kv_routing

        kv = make_kv_routing(settings, hooks)
    app = create_app(settings, hooks, discovery=discovery, kv=kv, start_discovery=False)
    await discovery.start()
    try:
        server = uvicorn.Server(uvicorn_config(app, settings))
        log.info("serving on http://%s:%d (discovery %s)", settings.host, settings.port, settings.discovery)
        await server.serve()
        if not server.started:
            raise InferaError(
                f"the server did not start on {settings.host}:{settings.port} (see the log above)"
            )
    finally:
        await discovery.close()


def run(settings: ServeSettings, hooks: InferaHooks) -> None:
    import uvloop

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(settings, hooks))
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled: a clean stop
        log.info("stopped")

"""Run the server with uvicorn (uvloop + httptools; the protocol, with TCP_NODELAY and the
connection limits, is :mod:`infera_core.server.protocol`)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import uvicorn

from infera_core.errors import InferaError
from infera_core.facade import InferaHooks
from infera_core.server.app import KvComponent, create_app, make_discovery
from infera_core.server.protocol import protocol_class
from infera_core.server.settings import ServeSettings

log = logging.getLogger("infera.server")


def uvicorn_config(app: Any, settings: ServeSettings, log_level: str = "warning") -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=protocol_class(settings),
        lifespan="on",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        log_level=log_level,
        timeout_keep_alive=settings.idle_timeout,  # type: ignore[arg-type]  # a float works (call_later)
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
        await app.state.core.upstream.start()  # a transport that cannot start: one line, not a traceback
        start_kv_transport = getattr(kv, "start_transport", None)
        if start_kv_transport is not None:
            await start_kv_transport(settings.kv_event_transport)
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

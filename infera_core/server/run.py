"""Run the server with uvicorn (uvloop + httptools; the protocol, with TCP_NODELAY and the
connection limits, is :mod:`infera_core.server.protocol`)."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections.abc import Callable
from typing import Any

import uvicorn

from infera_core.errors import InferaError
from infera_core.plugin.hooks import InferaHooks
from infera_core.server.app import create_app, make_discovery
from infera_core.server.fds import fit_connections
from infera_core.server.kv import KvComponent
from infera_core.server.multiproc import process_count, supervise
from infera_core.server.peers import Peers
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


async def serve(
    settings: ServeSettings,
    hooks: InferaHooks,
    kv: KvComponent | None = None,
    *,
    sock: socket.socket | None = None,
    peers: Peers | None = None,
    on_ready: Callable[[], object] | None = None,
) -> None:
    """Start discovery (clear error if unreachable), then serve until SIGINT/SIGTERM.

    ``sock``: a bound socket to listen on (one of ``--processes N``), ``peers``: this
    process among them (whole-router routes), ``on_ready``: called once it serves."""
    discovery = make_discovery(settings, hooks)
    if kv is None:
        from infera_core.kv.component import make_kv_routing

        kv = make_kv_routing(settings, hooks.catalog())
    app = create_app(settings, hooks, discovery=discovery, kv=kv, start_discovery=False)
    if peers is not None:
        peers.install(app, kv, settings.public_metrics)
    await discovery.start()
    ready: asyncio.Task[None] | None = None
    try:
        await app.state.core.upstream.start()  # a transport that cannot start: one line, not a traceback
        await kv.start_transport(settings.kv_event_transport)
        if peers is not None:
            await peers.start()
        server = uvicorn.Server(uvicorn_config(app, settings))
        if peers is None:
            log.info(
                "serving on http://%s:%d (discovery %s, policy %s)",
                settings.host,
                settings.port,
                settings.discovery,
                app.state.core.scheduler.default.name,
            )
        if on_ready is not None:
            ready = asyncio.create_task(_when_started(server, on_ready))
        await server.serve(sockets=[sock] if sock is not None else None)
        if not server.started:
            raise InferaError(
                f"the server did not start on {settings.host}:{settings.port} (see the log above)"
            )
    finally:
        if ready is not None:
            ready.cancel()
        if peers is not None:
            await peers.close()
        await discovery.close()


async def _when_started(server: uvicorn.Server, then: Callable[[], object]) -> None:
    while not server.started:  # noqa: ASYNC110 (uvicorn sets a flag, no event)
        await asyncio.sleep(0.02)
    then()


def run_process(settings: ServeSettings, hooks: InferaHooks, **kwargs: Any) -> None:
    """:func:`serve` on a fresh uvloop until stopped (``kwargs`` as :func:`serve`'s)."""
    import uvloop

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(settings, hooks, **kwargs))
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled: a clean stop
        log.info("stopped")


def run(settings: ServeSettings, hooks: InferaHooks) -> None:
    """``infera-run serve``: one process, or ``--processes N`` under a supervisor."""
    exposed = settings.open_to_network(settings.host)
    if exposed:
        log.warning(exposed)
    fit_connections(settings)  # the processes inherit the raised open-file limit
    count = process_count(settings)
    if count == 1:
        run_process(settings, hooks)
        return
    status = supervise(settings, hooks, count, run_process)
    if status:
        sys.exit(status)

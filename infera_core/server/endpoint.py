"""The shared life of one proxied request (raw ASGI): read, validate, dispatch, relay, account.

Subclasses say how a body becomes a routed request (:meth:`ProxyEndpoint.prepare`)
and how the worker's response goes back (:meth:`ProxyEndpoint.relay`). This class
owns errors (OpenAI- or Anthropic-shaped), client disconnects (a watcher cancels
the request, which closes the upstream connection), releasing the worker, and the
per-request metrics.
"""

from __future__ import annotations

import asyncio
import time

from infera_core.scheduling.types import Endpoint, RequestContext
from infera_core.server.asgi import ON_DISCONNECT, ClientGone, Receive, Scope, Send, read_body, send_error
from infera_core.server.core import RouterCore, watch_disconnect
from infera_core.server.errors import ApiError
from infera_core.server.transport import UpstreamResponse
from infera_core.server.validate import parse_object


class ProxyEndpoint:
    """Base of the hot routes. ``route`` labels metrics; ``anthropic`` shapes errors."""

    anthropic = False

    def __init__(self, core: RouterCore, route: str, max_body: int) -> None:
        self.core = core
        self.route = route
        self.max_body = max_body

    def prepare(self, scope: Scope, raw: bytes, body: dict[str, object]) -> tuple[RequestContext, str, bytes]:
        """Validate; return (context, upstream path, upstream body). Raise :class:`ApiError`."""
        raise NotImplementedError

    async def relay(
        self, send: Send, resp: UpstreamResponse, ctx: RequestContext, ep: Endpoint, t0: float
    ) -> bool:
        """Send the worker's response to the client; True when it completed normally."""
        raise NotImplementedError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        core = self.core
        model = "-"
        status = 500
        watcher: asyncio.Future[None] | None = None
        gone: list[bool] = []
        try:
            raw = await read_body(scope, receive, self.max_body)
            ctx, path, upstream_body = self.prepare(scope, raw, parse_object(raw))
            model = ctx.model
            task = asyncio.current_task()
            assert task is not None
            if ON_DISCONNECT in scope:
                scope[ON_DISCONNECT] = _Canceller(task, gone)
            else:
                watcher = asyncio.ensure_future(watch_disconnect(receive, task, gone))
            ep, resp = await core.dispatch(ctx, path, upstream_body)
            status = resp.status
            ok = False
            try:
                ok = await self.relay(send, resp, ctx, ep, t0)
            finally:
                resp.release()
                core.release(ctx, ep, ok)
        except ApiError as err:
            status = err.status
            if err.code == "model_not_found":
                model = "-"  # never a label per unknown name
            await send_error(send, err, anthropic=self.anthropic)
        except ClientGone:
            status = 499
        except asyncio.CancelledError:
            if not gone:
                raise
            status = 499  # the client went away: the upstream request was cancelled with us
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        finally:
            if watcher is not None and not watcher.done():
                watcher.cancel()
            scope[ON_DISCONNECT] = None
            core.metrics.request_done(self.route, model, status, time.perf_counter() - t0)


class _Canceller:
    """Called by the server when the client goes away: cancel the request's task."""

    __slots__ = ("gone", "task")

    def __init__(self, task: asyncio.Task[object], gone: list[bool]) -> None:
        self.task = task
        self.gone = gone

    def __call__(self) -> None:
        if not self.task.done():
            self.gone.append(True)
            self.task.cancel()

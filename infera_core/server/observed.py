"""The access-log line and the trace of a request answered by an ordinary route handler.

The hot routes (:mod:`infera_core.server.endpoint`) log and trace themselves; the routes a
FastAPI handler answers by forwarding to one worker (``/tokenize``, ``/detokenize``,
``/v1/messages/count_tokens``, the pooling routes: ``/v1/embeddings``, ``/score``,
``/rerank``, ``/classify``) use :class:`Observed`: one ``--access-log`` line each, and with
``--otlp-traces-endpoint`` an ``infera.request`` span with an ``infera.upstream`` child per
worker tried, whose ``traceparent`` the worker gets.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.responses import Response

from infera_core.request import RequestContext
from infera_core.server.access_log import AccessLog, AccessRecord, fields
from infera_core.server.asgi import ClientGone
from infera_core.server.errors import ApiError
from infera_core.server.metrics import ServerMetrics
from infera_core.server.tracing import RequestTrace, Tracing, end_request

ACCESS_LOG_STATE = "access_log"
"""Where ``create_app`` keeps the :class:`AccessLog` on ``app.state`` (absent: logging off)."""


class Observed:
    """One request's access record and trace (each None when off)."""

    __slots__ = ("access", "ctx", "logged", "model", "route", "trace")

    def __init__(self, request: Request, route: str, request_id: str) -> None:
        state = request.app.state
        self.route = route
        self.model = "-"
        """The metric and log label: set once the model is known to be served (never a label
        per unknown name)."""
        self.access: AccessLog | None = getattr(state, ACCESS_LOG_STATE, None)
        self.logged = self.access.start() if self.access is not None else None
        tracing: Tracing | None = getattr(state, "tracing", None)
        self.trace: RequestTrace | None = tracing.start(request.scope, route) if tracing is not None else None
        ctx = self.ctx = RequestContext(request_id, "-", route, {})
        rid = request.headers.get("x-request-id")
        ctx.client_request_id = rid[:128] if rid else None
        ctx.access = self.logged if self.logged is not None else AccessRecord()  # usage, worker
        ctx.trace = self.trace

    def upstream_headers(self, worker: str, attempt: int) -> dict[str, str]:
        """Headers for one attempt on ``worker``: its span's ``traceparent`` when tracing."""
        if self.trace is None:
            return {}
        return {"traceparent": self.trace.open_upstream(worker, attempt)}

    def failed(self) -> None:
        """The attempt just made got no usable answer."""
        if self.trace is not None:
            self.trace.end_upstream(False)

    def answered(self, worker: str, ttft: float, prompt: int = 0, completion: int = 0) -> None:
        """``worker`` answered after ``ttft`` seconds with this usage."""
        rec = self.ctx.access
        if rec is not None:
            rec.worker = worker
            rec.ttft = ttft
            rec.prompt, rec.completion = prompt, completion

    def retried(self) -> None:
        rec = self.ctx.access
        if rec is not None:
            rec.retries += 1

    def finish(self, status: int, seconds: float) -> None:
        """The request's line and the end of its span."""
        model = self.model
        if self.logged is not None and self.access is not None:
            self.access.write(fields(self.logged, self.ctx, self.route, model, status, seconds))
        if self.trace is not None:
            end_request(self.trace, self.ctx, model, status)


Handler = Callable[[Observed], Awaitable[Response]]


async def answer_observed(
    request: Request,
    route: str,
    request_id: str,
    metrics: ServerMetrics,
    handle: Handler,
    on_error: Callable[[ApiError], Response] | None = None,
) -> Response:
    """``handle(obs)``'s answer, counted (``infera_requests_total``, the duration), logged and
    traced whatever it is: an :class:`ApiError` is raised on (or answered by ``on_error``), a
    client gone is a 499."""
    t0 = time.perf_counter()
    obs = Observed(request, route, request_id)
    status = 500
    try:
        resp = await handle(obs)
        status = resp.status_code
        return resp
    except ApiError as err:
        status = err.status
        if on_error is None:
            raise
        return on_error(err)
    except ClientGone:
        status = 499
        return Response(status_code=499)
    finally:
        elapsed = time.perf_counter() - t0
        metrics.request_done(route, obs.model, status, elapsed)
        obs.finish(status, elapsed)

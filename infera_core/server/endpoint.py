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

from infera_core.kv.hashing import namespace_root
from infera_core.request import RequestContext
from infera_core.scheduling.explain import Decision
from infera_core.scheduling.scheduler import DIRECT_HEADER
from infera_core.scheduling.types import Endpoint
from infera_core.server.access_log import AccessLog, AccessRecord, fields
from infera_core.server.asgi import (
    CLIENT_CLOSING,
    ON_DISCONNECT,
    ClientGone,
    EchoHeader,
    Receive,
    Scope,
    Send,
    raw_header,
    read_body,
    send_error,
)
from infera_core.server.auth import AdminGate, ClientAuth
from infera_core.server.core import RouterCore, watch_disconnect
from infera_core.server.decisions import EXPLAIN_HEADER, DecisionLog, ExplainSend, asked, may_explain
from infera_core.server.errors import ApiError
from infera_core.server.loops import came_back, stamped
from infera_core.server.resume import Migrator
from infera_core.server.slo import TARGET_HEADERS, check_target
from infera_core.server.surrogates import LoneSurrogates
from infera_core.server.tracing import Tracing, end_request
from infera_core.server.validate import BodyLimits, parse_body, parse_short_body
from infera_core.transports.upstreams import UpstreamResponse

_YIELD_AFTER = 256 * 1024
"""Body bytes beyond which parsing took long enough that the client may have left meanwhile."""


class ProxyEndpoint:
    """Base of the hot routes. ``route`` labels metrics; ``anthropic`` shapes errors."""

    anthropic = False
    auth: ClientAuth | None = None
    """API keys (``--api-key-file``); None: requests need no key."""
    admin: AdminGate = AdminGate(None)
    """Who may use direct mode (``x-worker-instance-id``)."""
    migrator: Migrator | None = None
    """Continues streams that break mid-way on another worker (``--migration-limit``)."""
    access_log: AccessLog | None = None
    """``--access-log``: one line per (sampled) request; None: off."""
    decisions: DecisionLog | None = None
    """Routing explanations (``X-Infera-Explain``) and the decisions kept for the admin."""
    tracing: Tracing | None = None
    """OpenTelemetry (``--otlp-traces-endpoint``); None: off."""

    def __init__(self, core: RouterCore, route: str, limits: BodyLimits) -> None:
        self.core = core
        self.route = route
        self.limits = limits

    def prepare(self, scope: Scope, raw: bytes, body: dict[str, object]) -> tuple[RequestContext, str, bytes]:
        """Validate; return (context, upstream path, upstream body). Raise :class:`ApiError`."""
        raise NotImplementedError

    async def dispatch(
        self, ctx: RequestContext, path: str, body: bytes, task: asyncio.Task[object], via: bytes | None
    ) -> tuple[Endpoint, UpstreamResponse]:
        """Route and open the upstream request (:meth:`RouterCore.dispatch`); a route whose
        requests must reach one worker overrides it."""
        return await self.core.dispatch(ctx, path, body, task, via)

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
        # one pass over the headers for the two every request needs
        client_rid: str | None = None
        length: bytes | None = None
        via: bytes | None = None
        explain: bytes | None = None
        targets: list[tuple[bytes, bytes]] = []
        for name, value in scope["headers"]:
            if name == b"content-length":
                if length is None:
                    length = value
            elif name == b"x-request-id" and client_rid is None:
                client_rid = value.decode("latin-1")
            elif name == b"via":
                via = value if via is None else via + b", " + value
            elif name == EXPLAIN_HEADER:
                explain = value
            elif name in TARGET_HEADERS:
                targets.append((name, value))
        if client_rid is not None:
            send = EchoHeader(send, b"x-request-id", client_rid.encode("latin-1"))
        ctx: RequestContext | None = None
        access = self.access_log
        logged = access.start() if access is not None else None
        kept: Decision | None = None
        tracing = self.tracing
        trace = tracing.start(scope, self.route) if tracing is not None else None
        try:
            auth = self.auth
            principal = auth.authenticate(scope) if auth is not None else None
            for name, value in targets:  # latency targets (predicted-latency): 400 when malformed
                check_target(name, value)
            task = asyncio.current_task()
            assert task is not None
            hooked = ON_DISCONNECT in scope
            if hooked:  # a disconnect while the body is read or parsed cancels us too
                scope[ON_DISCONNECT] = _Canceller(task, gone)
            limits = self.limits
            raw = await read_body(scope, receive, limits.max_bytes, limits.max_items, length)
            if via is not None and stamped(via, core.router_id_bytes):
                raise came_back(core.router_id)  # its sender (this router) isolates the worker
            try:
                if len(raw) <= limits.max_items:
                    body = parse_short_body(raw, limits)
                else:  # read_body counted its items
                    body = await parse_body(raw, limits, counted=True)
            except LoneSurrogates as lone:  # forwarded with U+FFFD in their place (surrogates.py)
                raw = lone.repaired
                body = await parse_body(raw, limits, counted=True)
            if len(raw) > _YIELD_AFTER:
                await _left_meanwhile(scope)
            ctx, path, upstream_body = self.prepare(scope, raw, body)
            ctx.client_request_id = client_rid
            ctx.access = logged
            model = ctx.model
            if auth is not None and principal is not None:
                ctx.principal = principal
                ctx.budget = await auth.admit_waiting(principal, model, ctx.body, ctx.token_ids)
            base = core.table.lora_base.get(model)
            if base is not None:  # a LoRA adapter: its base's tokenizer, its own KV root
                ctx.lora, ctx.base_model, ctx.kv_root = model, base, namespace_root(model)
            engines = (ep.record.engine for ep in core.table.candidates(model))
            upstream_body = core.salting.apply(ctx, upstream_body, engines)
            decisions = self.decisions
            if decisions is not None:
                if explain is not None and asked(explain) and may_explain(principal, self.admin, scope):
                    ctx.explain = Decision()
                    send = ExplainSend(send, ctx.explain)
                elif decisions.sample and decisions.sampled():
                    ctx.explain = Decision()
            kept = ctx.explain  # asked for or sampled: kept for /v1/admin/decisions
            if trace is not None:  # the span's figures come from the same record, its terms from a Decision
                ctx.trace = trace
                if logged is None:
                    ctx.access = AccessRecord()
                if ctx.explain is None:
                    ctx.explain = Decision()
            if core.scheduler.direct and raw_header(scope, DIRECT_HEADER.encode()) is not None:
                self.admin.check(scope, "Direct routing (x-worker-instance-id)")
            if not hooked:
                watcher = asyncio.ensure_future(watch_disconnect(receive, task, gone))
            ep, resp = await self.dispatch(ctx, path, upstream_body, task, via)
            status = resp.status
            rec = ctx.access
            if rec is not None:
                rec.worker = ep.worker_id
                rec.ttft = time.perf_counter() - t0  # the answer's headers (a stream: its first event)
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
            if ctx is not None and ctx.budget is not None and auth is not None:
                auth.release(ctx.principal, ctx.budget)  # nothing relayed: the reservation is returned
            elapsed = time.perf_counter() - t0
            core.metrics.request_done(self.route, model, status, elapsed)
            if logged is not None and access is not None:
                access.write(fields(logged, ctx, self.route, model, status, elapsed))
            if kept is not None and self.decisions is not None:
                self.decisions.add(kept, status)
            if trace is not None:
                end_request(trace, ctx, model, status)

    def count_usage(self, ctx: RequestContext, prompt: int, completion: int, cached: int = 0) -> None:
        """Tokens of one answered request (the engine's usage report): per model, and per API
        key when keys are on. A report of nothing (no usage in the answer) charges the key the
        request's whole reservation. ``cached``: the report's cached prompt tokens."""
        self.core.metrics.usage(ctx.model, prompt, completion)
        logged = ctx.access
        if logged is not None:
            logged.prompt, logged.completion = prompt, completion
        if self.auth is not None and ctx.principal is not None:
            charge = ctx.budget
            if not (prompt or completion) and charge is not None:
                prompt = charge.tokens  # nothing reported: what the request could have cost
            self.auth.spent(ctx.principal, ctx.model, prompt, completion, charge, cached)

    def count_relayed(self, ctx: RequestContext, events: int) -> None:
        """A stream that ended without the engine's usage report (the client left, the worker
        failed, or the engine sends none): the key is charged the prompt estimate and one
        token per relayed event (each carries at least one token)."""
        charge = ctx.budget
        if self.auth is None or ctx.principal is None or charge is None or charge.settled:
            return
        prompt = len(ctx.token_ids) if ctx.token_ids else charge.prompt
        self.auth.spent(ctx.principal, ctx.model, prompt, max(0, events), charge)


async def _left_meanwhile(scope: Scope) -> None:
    """:class:`ClientGone` if the client left while its body was parsed (a long, loop-blocking
    step): two loop turns let the loop see the socket's EOF or reset, then the transport says."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    closing = scope.get(CLIENT_CLOSING)
    if closing is not None and closing():
        raise ClientGone


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

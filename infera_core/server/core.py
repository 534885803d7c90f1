"""The routing core of one server: schedule → open upstream (with retries) → release.

``dispatch(ctx, path, body)`` returns the chosen endpoint and the worker's response
once its headers arrived; failures before that (connect error, timeout, 5xx, 429)
are retried on another worker, up to ``--request-max-retries``. The caller streams
the body and must call :meth:`RouterCore.release` exactly once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import secrets
from collections.abc import Awaitable, Callable, Collection
from functools import partial
from typing import TYPE_CHECKING

from infera_core.request import RequestContext
from infera_core.scheduling.arrays import state as arrays_state
from infera_core.scheduling.scheduler import (
    NoWorkerError,
    OverloadedError,
    Scheduler,
    UnknownModelError,
)
from infera_core.scheduling.types import Endpoint
from infera_core.server.breaker import Breakers
from infera_core.server.decisions import DecisionLog
from infera_core.server.errors import ApiError
from infera_core.server.fleet import EndpointTable
from infera_core.server.hangs import HangDetector
from infera_core.server.loops import LOOP_HEADER, LOOP_STATUS, loop_error, via_value
from infera_core.server.metrics import ServerMetrics
from infera_core.server.not_found import EngineAnswer, engine_error, not_an_engine
from infera_core.server.priority import with_priority
from infera_core.server.queue import RouterQueue, ticket_for
from infera_core.server.routing_mode import RoutingModes
from infera_core.server.tenancy import CacheSalting
from infera_core.server.tracing import traced_acquire, traced_prepare, traced_schedule
from infera_core.transports.upstreams import (
    READ_ERRORS,
    PoolTimeoutError,
    RequestTooLargeError,
    TransportDownError,
    Upstream,
    UpstreamError,
    UpstreamResponse,
)
from infera_core.util.redact import redact_url
from infera_core.worker import DP_RANK_HEADER, TASK_ROUTES, Role

if TYPE_CHECKING:
    from infera_core.server.pd.dispatch import PdDispatcher

log = logging.getLogger("infera.server")

_PROMPT_RE = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION_RE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
REFUSED_SKIPS = 8
"""Workers refusing a request's connection (nothing was sent) that it passes over without using
one of its ``--max-retries``: records of workers just gone outlive them by up to a lease."""


def usage_of(data: bytes) -> tuple[int, int]:
    """(prompt, completion) tokens from the last ``usage`` object in ``data`` (0 when absent)."""
    # per answered request: each key is found from the end (rfind) and matched there, so the
    # regex runs over a few bytes, not the whole tail
    at = data.rfind(b'"prompt_tokens"')
    m = _PROMPT_RE.match(data, at) if at >= 0 else None
    p = int(m.group(1)) if m is not None else _last(data, at, _PROMPT_RE)
    at = data.rfind(b'"completion_tokens"')
    m = _COMPLETION_RE.match(data, at) if at >= 0 else None
    c = int(m.group(1)) if m is not None else _last(data, at, _COMPLETION_RE)
    return p, c


def _last(data: bytes, end: int, pattern: re.Pattern[bytes]) -> int:
    """The number of the last match of ``pattern`` before ``end`` (the last key was not
    followed by a number, e.g. ``null``), 0 when none."""
    n = 0
    if end > 0:
        for m in pattern.finditer(data, 0, end):
            n = int(m.group(1))
    return n


class RouterCore:
    """Shared state and the retrying dispatch used by every proxy route."""

    def __init__(
        self,
        table: EndpointTable,
        scheduler: Scheduler,
        upstream: Upstream,
        breakers: Breakers,
        metrics: ServerMetrics,
        max_retries: int,
    ) -> None:
        self.table = table
        self.scheduler = scheduler
        self.upstream = upstream
        """The server's clients (:class:`~infera_core.transports.clients.Upstreams`), or one
        client for every worker; requests go through each endpoint's own ``ep.upstream``."""
        if table.upstream_for is None:  # one client for all (tests, embedding code)
            table.upstream_for = lambda record: upstream
            for ep in table.by_id.values():
                ep.upstream = upstream
        self.breakers = breakers
        self.metrics = metrics
        self.max_retries = max_retries
        self.prepare: Callable[[RequestContext], Awaitable[None]] | None = None
        """Fills ``ctx.token_ids`` for routing (KV component) when the profile needs tokens."""
        self._ids = itertools.count(1)
        self.router_id = f"infera-{os.getpid():x}{secrets.token_hex(4)}"
        """This router process's id: its ``Via`` stamp (:mod:`infera_core.server.loops`)."""
        self.router_id_bytes = self.router_id.encode()
        self._id_prefix = self.router_id + "-"
        self.hangs: HangDetector | None = None
        """First-byte outlier detection (``--hang-timeout``): hung workers leave rotation."""
        self.routing_modes: RoutingModes | None = None
        """Each model's routing mode (tokens / text / load), said once per model."""
        self.pd: PdDispatcher | None = None
        """The PD path (``infera_core.server.pd``): models served by prefill/decode pairs."""
        self.salting = CacheSalting()
        """Request ``cache_salt`` → the KV hashes' root; the key file's cache isolation."""
        self.decisions: DecisionLog | None = None
        """The last routing decisions explained or sampled (``/v1/admin/decisions``)."""
        self.queue: RouterQueue | None = None
        """The router queue (``--queue-max``): saturated models queue requests instead of a 429."""
        self.headroom = 0
        """In-flight slots per worker kept from sheddable requests and from keys over their fair
        share (``--queue-headroom``)."""

    def request_id(self) -> str:
        """A new id for the engine, the scorers' bookkeeping and PD transfers. Never the
        client's ``X-Request-Id``: that one is only a label (``ctx.client_request_id``)."""
        return f"{self._id_prefix}{next(self._ids)}"

    def schedule(self, ctx: RequestContext, exclude: list[str]) -> Endpoint:
        """One routing decision, with scheduler errors turned into API errors."""
        try:
            return self._schedule(ctx, exclude)
        except OverloadedError as exc:
            raise ApiError(429, str(exc), code="worker_overloaded", headers={"Retry-After": "1"}) from None

    def schedule_limited(self, ctx: RequestContext, limited: bool, avoid: Collection[str] = ()) -> Endpoint:
        """The queue's routing decision: :class:`OverloadedError` when every worker is
        saturated; ``limited`` (a sheddable tier, a key over its fair share) leaves
        ``headroom`` slots of each worker free; ``avoid``: workers kept from this request's
        tier (``--queue-tier-window``): none of the others able to take it is saturation too."""
        cap = self.scheduler.max_inflight
        held = max(1, cap - self.headroom) if limited and cap > 0 and self.headroom else None
        if not avoid:
            return self._schedule(ctx, (), held)
        try:
            return self._schedule(ctx, avoid, held)
        except NoWorkerError:
            raise OverloadedError("the workers this tier may use now are busy") from None

    def workers(self, model: str) -> list[str]:
        """The ids of the model's workers (the tier guard's fleet)."""
        return [ep.worker_id for ep in self.table.candidates(model)]

    def slots(self, model: str) -> int:
        """This process's part of the model's in-flight slots (``--max-inflight-per-worker`` ×
        its workers, over the processes of ``serve --processes N``, each of which counts its own
        requests per key; 0: no cap)."""
        shared = arrays_state().shared
        processes = shared.processes if shared is not None else 1
        return self.scheduler.max_inflight * len(self.table.candidates(model)) // processes

    def _schedule(self, ctx: RequestContext, exclude: Collection[str], cap: int | None = None) -> Endpoint:
        try:
            if cap is None:
                return self.scheduler.schedule(ctx, exclude)
            return self.scheduler.schedule(ctx, exclude, cap)
        except UnknownModelError as exc:
            serves = self.table.tasks_of(exc.model)
            if serves:  # a pooling model (embeddings, scores): no worker of it generates
                raise ApiError(
                    400,
                    f"The model {exc.model!r} does not serve {ctx.route}: its workers serve"
                    f" {', '.join(f'{t} ({TASK_ROUTES[t][0]})' for t in serves)}, not generation.",
                    param="model",
                    code="model_not_supported",
                ) from None
            shown = ", ".join(exc.available)
            raise ApiError(
                404,
                f"The model {exc.model!r} does not exist on this server. Available models: {shown}",
                param="model",
                code="model_not_found",
            ) from None
        except NoWorkerError as exc:
            raise ApiError(503, f"No worker available: {exc}", code="no_worker_available") from None

    async def dispatch(
        self,
        ctx: RequestContext,
        path: str,
        body: bytes,
        task: asyncio.Task[object] | None = None,
        via: bytes | None = None,
        exclude: list[str] | None = None,
        queued: bool = True,
    ) -> tuple[Endpoint, UpstreamResponse]:
        """``task``: the request's task when the caller has it (the hang detector cancels it);
        ``via``: the request's own ``Via`` header, kept in front of this router's stamp;
        ``exclude``: workers not to use (a migrated stream's failed ones); ``queued=False``: never
        through the router queue, which picks among all workers (a request pinned to one)."""
        if self.pd is not None and await self.pd.applies(ctx):
            return await self.pd.dispatch(ctx, path, body, exclude or ())
        tried: list[str] = list(exclude) if exclude else []
        last: ApiError | None = None
        attempts = 1 + self.max_retries
        headers = {
            "Content-Type": "application/json",
            "X-Request-Id": ctx.request_id,
            "Via": via_value(via, self.router_id),
        }
        queue = self.queue if self.queue is not None and self.queue.enabled else None
        ticket = ticket_for(ctx.principal, ctx.headers)  # the queue's order; the engine's priority
        client_priority = "priority" in ctx.body
        tr = ctx.trace  # OpenTelemetry spans (tracing.py), None when tracing is off
        if self.prepare is not None and self.scheduler.profile_of(ctx).needs_tokens:
            if tr is None:
                await self.prepare(ctx)
            else:
                await traced_prepare(self.prepare, ctx, tr)
        skipped = 0  # workers that refused the connection (nothing sent): passed over, no retry used
        for attempt in itertools.count():
            if attempt >= attempts:
                break
            if attempt == 0 and queue is not None and queued:
                pick = (  # its slot taken: in_flight counted
                    queue.acquire(ctx, ticket)
                    if not tried  # a continuation: never back to the workers that failed it
                    else queue.acquire_with(
                        ctx, ticket, partial(self._take, ctx, tuple(tried)), self._untake(ctx)
                    )
                )
                ep = await (pick if tr is None else traced_acquire(pick, ctx, tr))
            else:
                try:
                    ep = (
                        self.schedule(ctx, tried)
                        if tr is None
                        else traced_schedule(self.schedule, ctx, tried, tr)
                    )
                except ApiError:
                    if last is not None:
                        raise last from None
                    raise
                ep.in_flight += 1
            if attempt == 0 and ctx.principal is not None:
                self.salting.routed(ctx, ep)  # its prediction now: once served, the worker holds it
            self.breakers.picked(ep)
            rank = self.scheduler.dp.choose(ep, ctx) if ep.record.dp_size > 1 else None
            sent = headers if rank is None else {**headers, DP_RANK_HEADER: str(rank)}
            if tr is not None:  # the engine continues the trace under this upstream call's span
                sent = {**sent, "traceparent": tr.open_upstream(ep.worker_id, attempt)}
            hangs = self.hangs
            wait = hangs.begin(ep, task) if hangs is not None else None
            order = ep.record.priority
            sent_body = body
            if order is not None or client_priority:  # the tier as the engine's priority (priority.py)
                sent_body = with_priority(body, ctx.body, ticket.tier, order)
            try:
                resp = await ep.upstream.open(ep, path, sent_body, sent)
            except PoolTimeoutError as exc:
                if hangs is not None:
                    hangs.end(wait, False)
                self._abandoned(ctx, ep)  # the router's own cap: not the worker's fault, no retry
                log.warning("request %s: %s", ctx.log_id, exc.reason)
                raise ApiError(
                    503,
                    f"Router busy: {exc.reason}",
                    code="upstream_pool_timeout",
                    headers={"Retry-After": "1"},
                ) from None
            except RequestTooLargeError as exc:
                if hangs is not None:
                    hangs.end(wait, False)
                self._abandoned(ctx, ep)  # the request's problem: no retry, the breaker untouched
                raise ApiError(413, f"Request too large: {exc.reason}", code="request_too_large") from None
            except UpstreamError as exc:
                if hangs is not None:
                    hangs.end(wait, False)
                self._failed(ctx, ep, worker_fault=not isinstance(exc, TransportDownError))
                log.warning("request %s: %s", ctx.log_id, exc)
                last = ApiError(
                    504 if exc.timeout else 502,
                    f"Worker {ep.worker_id} failed before responding: {exc.reason}",
                    code="upstream_timeout" if exc.timeout else "upstream_unreachable",
                )
                if exc.refused and skipped < REFUSED_SKIPS:  # a worker just gone, its record not yet
                    skipped += 1
                    attempts += 1
            except BaseException as exc:
                self._abandoned(ctx, ep)  # cancelled (client gone) or a bug: release everything
                if hangs is None or wait is None:
                    raise
                hangs.end(wait, False)
                if not (wait.hung and isinstance(exc, asyncio.CancelledError)) or _uncancel() > 0:
                    raise  # not (only) the detector's cancel: the client went away too
                log.warning("request %s: worker %s is hung, retrying elsewhere", ctx.log_id, ep.worker_id)
                last = ApiError(
                    504,
                    f"Worker {ep.worker_id} accepted the request and sent nothing for"
                    f" {hangs.threshold:g} s (hung); it was taken out of rotation",
                    code="upstream_timeout",
                )
            else:
                if hangs is not None:
                    hangs.end(wait, True)
                status = resp.status
                if status < 500 and status != 429 and status != 404:
                    if status < 400 or ep.breaker_open:
                        self.breakers.success(ep)
                    return ep, resp
                if status == LOOP_STATUS and resp.header(LOOP_HEADER) == self.router_id:
                    resp.release()  # the request came back to this router: the record is a loop
                    self._abandoned(ctx, ep)
                    url = redact_url(ep.record.url)
                    self.breakers.isolate(ep, f"its URL {url} leads back to this router (a routing loop)")
                    last = loop_error(ep.worker_id, url)
                    tried.append(ep.worker_id)
                    continue
                try:
                    try:
                        data = await resp.read()
                    except READ_ERRORS:
                        data = b""
                    finally:
                        resp.release()
                except BaseException:
                    self._abandoned(ctx, ep)
                    raise
                if status == 404:
                    error = engine_error(data)
                    if error is not None:  # the engine's own answer (unknown model…): the client's
                        self._abandoned(ctx, ep)
                        if ep.breaker_open:
                            self.breakers.success(ep)
                        raise EngineAnswer(status, data, error)
                    self._failed(ctx, ep, worker_fault=True)
                    log.warning(
                        "request %s: worker %s answered 404 on %s without an API error: not an engine?",
                        ctx.log_id,
                        ep.worker_id,
                        path,
                    )
                    last = not_an_engine(ep.worker_id, path)
                else:
                    self._failed(ctx, ep, worker_fault=status >= 500)
                    log.warning("request %s: worker %s answered %d", ctx.log_id, ep.worker_id, status)
                    extra = {"Retry-After": resp.header("Retry-After") or "1"} if status == 429 else None
                    detail = data[:300].decode("utf-8", "replace")
                    last = ApiError(
                        status,
                        f"Worker {ep.worker_id} answered {status}: {detail}",
                        code="upstream_error",
                        type="upstream_error" if status >= 500 else None,
                        headers=extra,
                    )
            tried.append(ep.worker_id)
            if attempt + 1 < attempts:
                self.metrics.retried(ctx.model)
                if ctx.access is not None:
                    ctx.access.retries += 1
        assert last is not None
        raise last

    def _failed(self, ctx: RequestContext, ep: Endpoint, worker_fault: bool) -> None:
        ep.in_flight -= 1
        if ctx.trace is not None:
            ctx.trace.end_upstream(False)
        if worker_fault:
            opened = self.breakers.opened
            self.breakers.failure(ep)
            if self.breakers.opened != opened:
                self.metrics.breaker_opened.inc()
        self.scheduler.finished(ctx, ep, False)
        self._freed(ctx)

    def _abandoned(self, ctx: RequestContext, ep: Endpoint) -> None:
        """The attempt on ``ep`` ended without an answer and without the worker's fault."""
        ep.in_flight -= 1
        if ctx.trace is not None:
            ctx.trace.end_upstream(False)
        self.scheduler.finished(ctx, ep, False)
        self._freed(ctx)

    def release(self, ctx: RequestContext, ep: Endpoint, ok: bool) -> None:
        ep.in_flight -= 1
        if ctx.trace is not None:
            ctx.trace.end_upstream(ok)
        if self.pd is not None and ctx.role is not Role.MIXED:
            self.pd.finished(ctx, ep, ok)
        else:
            self.scheduler.finished(ctx, ep, ok)
        self._freed(ctx)

    def first_token(self, ctx: RequestContext, worker: str) -> None:
        """The first chunk of a stream from ``worker`` reached the router (for the scorers that
        learn each worker's latency; a PD leg's first token is the pair's: not passed)."""
        if ctx.role is not Role.MIXED:
            return
        ep = self.table.by_id.get(worker)
        if ep is not None:
            self.scheduler.first_token(ctx, ep)

    def stream_timed(self, ctx: RequestContext, worker: str, since_first: float, itl: float | None) -> None:
        """A stream from ``worker`` was relayed whole: its timing, for the scorers that learn
        each worker's latency (a PD leg's timing is the pair's, not one worker's: not passed)."""
        if ctx.role is not Role.MIXED:
            return
        ep = self.table.by_id.get(worker)
        if ep is not None:
            self.scheduler.timing(ctx, ep, since_first, itl)

    def _freed(self, ctx: RequestContext) -> None:
        """A slot freed: the queue dispatches its next waiter at once."""
        queue = self.queue
        if queue is not None:
            queue.freed(ctx)

    def _take(self, ctx: RequestContext, exclude: tuple[str, ...]) -> Endpoint:
        """The queue's pick for a request that must avoid ``exclude`` (its slot taken);
        :class:`OverloadedError` while every other worker is saturated."""
        ep = self._schedule(ctx, exclude)
        ep.in_flight += 1
        return ep

    def _untake(self, ctx: RequestContext) -> Callable[[Endpoint], None]:
        return lambda ep: self.unqueued(ctx, ep)

    def unqueued(self, ctx: RequestContext, ep: Endpoint) -> None:
        """A slot the queue took for a waiter whose client left before using it."""
        ep.in_flight -= 1
        self.scheduler.finished(ctx, ep, False)


def _uncancel() -> int:
    """Undo one cancel request of the current task; how many remain."""
    task = asyncio.current_task()
    return task.uncancel() if task is not None else 0


async def watch_disconnect(receive: object, task: asyncio.Task[object], flag: list[bool]) -> None:
    """Cancel ``task`` when the client goes away (``receive`` yields ``http.disconnect``)."""
    msg = await receive()  # type: ignore[operator]
    if msg.get("type") == "http.disconnect":
        flag.append(True)
        task.cancel()

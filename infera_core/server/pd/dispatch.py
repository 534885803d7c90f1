"""Executing a PD request: pick a pair, run the transport's protocol, hand decode's response back.

``RouterCore.dispatch`` hands a request here when :meth:`PdDispatcher.applies` (the model's
fleet is served by pairs); the result is what a mixed dispatch returns — the decode worker
and its response once its headers arrived — so the proxy relays it unchanged (streamed or
not; decode's ``usage`` counts the whole prompt because decode received the whole prompt).

* **serial pull** (``vllm-nixl``, ``atom-mooncake``): prefill leg to completion, then decode
  with its ``kv_transfer_params``. A decode failing before its first byte is retried on
  another compatible decode worker (the KV stays on the prefill until pulled).
* **concurrent push** (``sglang-bootstrap``, ``vllm-mooncake``): both legs at once. The
  prefill leg runs as its own task and is never cancelled (decode depends on it); if it
  fails before decode answered, decode is abandoned and the request moves to another pair.
  A decode failing before its first byte is a 502 (its KV went to that decode).

A prefill failure before anything reached the client moves to a new pair, at most
``pd.max_pair_retries`` times.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from infera_core.engines.pd import (
    PdContext,
    PdLegError,
    PdOrder,
    PdTransport,
    PdTransportRegistry,
    PdUnsupported,
)
from infera_core.request import RequestContext
from infera_core.scheduling.pd import Pair, PdConfig, PdScheduler, Topology
from infera_core.scheduling.scheduler import DIRECT_HEADER, OverloadedError, SchedulingError
from infera_core.scheduling.types import Endpoint
from infera_core.server.errors import ApiError
from infera_core.server.pd.legs import LegFailed, Legs
from infera_core.server.pd.metrics import PdMetrics
from infera_core.server.priority import body_with_priority
from infera_core.server.queue import ticket_for
from infera_core.server.tracing import decode_span, prefill_span, traced_pair, traced_prepare
from infera_core.transports.upstreams import UpstreamResponse

Routed = tuple[Endpoint, UpstreamResponse]

PAIRLESS_ROUTES = frozenset({"/v1/responses"})
"""Routes no PD transport serves (the answer is stored on the worker that makes it)."""


def _api_error(exc: SchedulingError) -> ApiError:
    if isinstance(exc, OverloadedError):
        return ApiError(429, str(exc), code="worker_overloaded", headers={"Retry-After": "1"})
    return ApiError(503, f"No worker available: {exc}", code="no_worker_available")


@dataclass(slots=True, eq=False)
class _Request:
    """One PD attempt: the client's request, the pair and the transport."""

    ctx: RequestContext
    body: dict[str, Any]
    pctx: PdContext
    transport: PdTransport
    pair: Pair
    path: str
    attempt: int
    held: list[Endpoint] = field(default_factory=list)
    """The pair's workers whose slot is still counted for it from the pick (``in_flight``),
    until its leg to that worker counts it itself (:meth:`PdDispatcher._let_go`)."""


class PdDispatcher:
    """The server's PD path (one per app)."""

    def __init__(
        self,
        core: Any,
        scheduler: PdScheduler,
        transports: PdTransportRegistry,
        metrics: PdMetrics,
        config: PdConfig,
    ) -> None:
        self.core = core
        self.scheduler = scheduler
        self.transports = transports
        self.metrics = metrics
        self.config = config
        self.legs = Legs(core.upstream, core.breakers, core.metrics, metrics, getattr(core, "hangs", None))
        self.legs.router_id = getattr(core, "router_id", "")
        self._background: set[asyncio.Task[Any]] = set()

    # -- entry points used by RouterCore -----------------------------------------------
    def _topology(self, ctx: RequestContext) -> Topology | None:
        """``ctx.model``'s topology (None: the client asked for a direct worker); a 503 when it
        cannot be served at all."""
        if self.core.scheduler.direct and ctx.headers.get(DIRECT_HEADER):
            return None
        topo = self.scheduler.topology(ctx.model)
        if topo.error is not None:
            raise ApiError(503, topo.error, code="no_pd_pair")
        return topo

    def pairs_only(self, ctx: RequestContext) -> bool:
        """True when only pairs serve ``ctx.model`` (a route pairs cannot serve is refused there;
        with mixed workers too, :meth:`applies` keeps such a route local)."""
        topo = self._topology(ctx)
        return topo is not None and topo.pd and not topo.per_request

    async def applies(self, ctx: RequestContext) -> bool:
        """True when ``ctx`` goes to a pair; a 503 when ``ctx.model`` cannot be served at all."""
        topo = self._topology(ctx)
        if topo is None:
            return False
        if topo.per_request:  # pairs and mixed workers: the predicted TTFT of each decides
            if ctx.route in PAIRLESS_ROUTES:
                return False
            prepare = getattr(self.core, "prepare", None)
            if prepare is not None and ctx.token_ids is None and self.scheduler.kv_index is not None:
                tr = ctx.trace
                await (prepare(ctx) if tr is None else traced_prepare(prepare, ctx, tr))
            return self.scheduler.choose(ctx).pd
        return topo.pd

    def finished(self, ctx: RequestContext, ep: Endpoint, ok: bool) -> None:
        """The decode leg's relay ended (``RouterCore.release``)."""
        if not ok:
            self.metrics.failed("decode_incomplete")
        self.scheduler.finished(ctx, ep, ok)

    async def dispatch(
        self, ctx: RequestContext, path: str, body: bytes, exclude: Collection[str] = ()
    ) -> Routed:
        """``exclude``: decode workers not to use (a migrated stream's failed ones: the
        continuation gets a fresh prefill and another decode worker)."""
        client_body: dict[str, Any] = ctx.body if path == ctx.route else json.loads(body)
        prepare = getattr(self.core, "prepare", None)
        tr = ctx.trace
        if prepare is not None and ctx.token_ids is None and self.scheduler.needs_tokens(ctx.model):
            await (prepare(ctx) if tr is None else traced_prepare(prepare, ctx, tr))
        tried_prefill: list[str] = []
        last: ApiError | None = None
        queue = self.core.queue
        ticket = ticket_for(ctx.principal, ctx.headers)  # the queue's order; the engines' priority
        for attempt in range(1 + self.config.max_pair_retries):
            # the pair's slots are counted from the pick on, so the cap holds for both leg orders
            try:
                if attempt == 0 and queue is not None and queue.enabled:  # none free: wait in order
                    pick = queue.acquire_with(
                        ctx,
                        ticket,
                        lambda: self._take_pair(ctx, exclude),
                        self._undo(ctx),
                    )
                else:
                    pick = self._pick_now(ctx, tried_prefill, exclude)
                pair = await (pick if tr is None else traced_pair(pick, tr))
            except SchedulingError as exc:
                raise (last or _api_error(exc)) from None
            p = pair.prefill
            protocol = p.record.pd.protocol if p.record.pd else ""
            transport = self.transports.get(protocol)
            pctx = PdContext(
                ctx.request_id,
                path,
                transfer_id=f"xfer-{ctx.request_id}-{attempt}",  # router-made: one per pair tried
                prefill_dp_rank=pair.prefill_rank,
                decode_dp_rank=pair.decode_rank,
            )
            try:
                transport.prepare(pctx, p.record, pair.decode.record)
            except PdUnsupported as exc:
                self._undo(ctx)(pair)
                raise ApiError(
                    400, f"This model is served with PD ({protocol}): {exc}", code="pd_unsupported"
                ) from None
            self.metrics.paired(p.worker_id, pair.decode.worker_id)
            # the tier as the engines' priority where both legs' engines schedule alike (priority.py)
            order = p.record.priority if p.record.priority == pair.decode.record.priority else None
            legs_body = client_body
            if order is not None or "priority" in client_body:
                legs_body = body_with_priority(client_body, ticket.tier, order)
            try:
                req = _Request(ctx, legs_body, pctx, transport, pair, path, attempt, [p, pair.decode])
                if transport.order is PdOrder.SERIAL:
                    return await self._serial(req)
                return await self._concurrent(req)
            except LegFailed as exc:
                if exc.side != "prefill" or exc.error.status == 413:  # 413: the request's fault
                    raise exc.error from None
                last = exc.error
                tried_prefill.append(p.worker_id)
                if attempt < self.config.max_pair_retries:
                    self.core.metrics.retried(ctx.model)
        assert last is not None
        raise last

    # -- serial pull ------------------------------------------------------------------------
    async def _serial(self, req: _Request) -> Routed:
        try:
            return await self._serial_legs(req)
        finally:
            if self._let_go(req):  # a leg never opened
                self._pump(req.ctx)

    async def _serial_legs(self, req: _Request) -> Routed:
        ctx, body, pctx, transport, path = req.ctx, req.body, req.pctx, req.transport, req.path
        p, d = req.pair.prefill, req.pair.decode
        leg = transport.prefill_request(body, pctx, p.record, d.record)
        self._let_go(req, p)  # the prefill leg counts p at once (no await between)
        t0 = time.perf_counter()
        try:
            with prefill_span(ctx.trace, leg.headers, p.worker_id, req.attempt):
                reply = await self.legs.prefill(p, leg, path)
        except BaseException:
            self.scheduler.finished(ctx, p, False)
            self.scheduler.finished(ctx, d, False)
            raise
        t1 = time.perf_counter()
        self.scheduler.finished(ctx, p, True)
        self.metrics.phase(ctx.model, "prefill", t1 - t0)
        tried: list[str] = []
        while True:
            try:
                dleg = transport.decode_request(body, pctx, p.record, d.record, reply)
                decode_span(ctx.trace, dleg.headers, d.worker_id, len(tried))
                self._let_go(req, d)  # the decode leg counts d at once
                resp = await self.legs.open_decode(d, dleg, path)
            except PdLegError as exc:
                self.scheduler.finished(ctx, d, False)
                err = ApiError(502, str(exc), code="pd_protocol_error")
                raise self.legs.fail("prefill", p, "no_transfer_params", err) from None
            except LegFailed as exc:
                self.scheduler.finished(ctx, d, False)
                tried.append(d.worker_id)
                if len(tried) > self.config.max_decode_retries:
                    raise
                try:
                    d, pctx.decode_dp_rank = self.scheduler.pick_decode(ctx, p, tried)
                except SchedulingError:
                    raise exc from None
                self.core.metrics.retried(ctx.model)
                continue
            except BaseException:
                self.scheduler.finished(ctx, d, False)
                raise
            t2 = time.perf_counter()
            self.metrics.phase(ctx.model, "transfer", t2 - t1)
            self.scheduler.transferred(ctx, t2 - t1)
            self.metrics.phase(ctx.model, "decode_wait", t2 - t1)
            self._pump(ctx)  # the prefill slot is free, the decode's counted by its leg
            return d, resp

    # -- concurrent push ----------------------------------------------------------------------
    async def _concurrent(self, req: _Request) -> Routed:
        ctx, body, pctx, transport, path = req.ctx, req.body, req.pctx, req.transport, req.path
        p, d = req.pair.prefill, req.pair.decode
        try:
            pleg = transport.prefill_request(body, pctx, p.record, d.record)
            dleg = transport.decode_request(body, pctx, p.record, d.record, None)
        except BaseException:
            if self._let_go(req):
                self.scheduler.finished(ctx, p, False)
                self.scheduler.finished(ctx, d, False)
                self._pump(ctx)
            raise
        decode_span(ctx.trace, dleg.headers, d.worker_id, 0)
        t0 = time.perf_counter()
        ptask = asyncio.ensure_future(self._prefill_timed(req, pleg, t0))
        self._background.add(ptask)
        ptask.add_done_callback(self._forget)
        dtask = asyncio.ensure_future(self.legs.open_decode(d, dleg, path))
        decode_finished = False
        try:
            try:
                await asyncio.wait((ptask, dtask), return_when=asyncio.FIRST_COMPLETED)
            finally:  # both legs count their workers by now
                if self._let_go(req):
                    self._pump(ctx)
            if not dtask.done() and ptask.exception() is not None:
                raise _prefill_failure(ptask)
            try:
                resp = await dtask
            except LegFailed as exc:
                self.scheduler.finished(ctx, d, False)
                decode_finished = True
                if ptask.done() and isinstance(ptask.exception(), LegFailed):
                    raise _prefill_failure(ptask) from None
                message = (
                    f"{exc.error.message} ({transport.name} pushes the KV to the decode worker chosen with "
                    "the prefill, so the decode leg is not retried elsewhere)"
                )
                raise ApiError(502, message, code="pd_decode_failed", type="upstream_error") from None
        except BaseException:
            _abandon(dtask, d)
            if not decode_finished:
                self.scheduler.finished(ctx, d, False)
            raise
        t2 = time.perf_counter()
        self.metrics.phase(ctx.model, "decode_wait", t2 - t0)
        if ptask.done() and ptask.exception() is None:
            self.metrics.phase(ctx.model, "transfer", t2 - ptask.result())
            self.scheduler.transferred(ctx, t2 - ptask.result())
        return d, resp

    async def _prefill_timed(self, req: _Request, leg: Any, t0: float) -> float:
        ctx, p = req.ctx, req.pair.prefill
        ok = False
        try:
            with prefill_span(ctx.trace, leg.headers, p.worker_id, req.attempt):
                await self.legs.prefill(p, leg, req.path, parse=False)
            ok = True
        finally:
            self.scheduler.finished(ctx, p, ok)
            self._pump(ctx)
        t1 = time.perf_counter()
        self.metrics.phase(ctx.model, "prefill", t1 - t0)
        return t1

    # -- the router queue's slots ---------------------------------------------------------------
    async def _pick_now(self, ctx: RequestContext, tried: list[str], exclude: Collection[str]) -> Pair:
        """A pair without waiting (a retry, or the queue off), its slots counted."""
        return _reserve(self.scheduler.pick_pair(ctx, tried, exclude))

    def _take_pair(self, ctx: RequestContext, exclude: Collection[str]) -> Pair:
        """A pair with its slots counted, for the queue: :class:`OverloadedError` while none is
        free (the queue retries), an :class:`ApiError` when the model has no pair at all."""
        try:
            return _reserve(self.scheduler.pick_pair(ctx, (), exclude))
        except OverloadedError:
            raise
        except SchedulingError as exc:
            raise _api_error(exc) from None

    def _undo(self, ctx: RequestContext) -> Callable[[Pair], None]:
        """Give back a reserved pair that is not used (its client left, or it cannot be sent)."""

        def undo(pair: Pair) -> None:
            for ep in (pair.prefill, pair.decode):
                ep.in_flight -= 1
                self.scheduler.finished(ctx, ep, False)

        return undo

    @staticmethod
    def _let_go(req: _Request, ep: Endpoint | None = None) -> bool:
        """Stop counting the pick's slot on ``ep`` (its leg counts it now; None: every one still
        held). True when one was held."""
        held = req.held
        if ep is None:
            for e in held:
                e.in_flight -= 1
            req.held = []
            return bool(held)
        if ep in held:
            held.remove(ep)
            ep.in_flight -= 1
            return True
        return False

    def _pump(self, ctx: RequestContext) -> None:
        queue = self.core.queue
        if queue is not None and queue.queues:
            queue.pump(ctx.model)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: counted by Legs already


def _reserve(pair: Pair) -> Pair:
    """Count ``pair``'s slots for it at once, so the queue's next waiter does not take them too."""
    pair.prefill.in_flight += 1
    pair.decode.in_flight += 1
    return pair


def _abandon(dtask: asyncio.Future[UpstreamResponse], ep: Endpoint) -> None:
    """Cancel a decode leg; if it already answered, close that response and release ``ep``."""

    def close(fut: asyncio.Future[UpstreamResponse]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return  # open_decode released ep itself
        with contextlib.suppress(Exception):
            fut.result().close()
        ep.in_flight -= 1

    if dtask.done():
        close(dtask)
    else:
        dtask.cancel()
        dtask.add_done_callback(close)


def _prefill_failure(ptask: asyncio.Future[float]) -> BaseException:
    exc = ptask.exception()
    assert exc is not None
    return exc

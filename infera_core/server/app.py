"""``create_app(settings, hooks, discovery=…, kv=…)``: the server as a FastAPI app.

Nothing is built at import time. The hot routes (``/v1/chat/completions``,
``/v1/completions``, ``/v1/messages``) are raw ASGI endpoints mounted on the
FastAPI router (no request/response objects per request); the control routes are
ordinary FastAPI handlers.

**KV seam** (for KV-aware routing): pass ``kv=`` a
:class:`~infera_core.server.kv.KvComponent` (``infera_core.kv.component.KvRouting``): its
``index`` is handed to policy factories as ``SchedulerDeps.kv_index``, it hears every
fleet change, the lifespan starts and stops it.

**PD seam**: routing and proxying are separate — ``RouterCore.schedule(ctx,
exclude)`` returns an :class:`Endpoint`; ``RouterCore.dispatch`` / ``Upstream.open``
send bytes to one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.routing import Route

from infera_core.config.backends import BackendOptions
from infera_core.discovery.base import Discovery, DiscoverySettings, SharedState
from infera_core.discovery.view import FleetView
from infera_core.plugin.hooks import InferaHooks
from infera_core.scheduling.router_config import RouterConfig, default_policy, load_router_config
from infera_core.scheduling.scheduler import build_scheduler
from infera_core.scheduling.types import Endpoint, SchedulerDeps
from infera_core.server.access_log import AccessLog
from infera_core.server.auth import (
    ADMIN_STATE,
    CLIENT_STATE,
    AdminGate,
    ClientAuth,
    client_principal,
    require_admin,
)
from infera_core.server.breaker import Breakers
from infera_core.server.core import RouterCore
from infera_core.server.count_tokens import add_count_tokens_route, anthropic_error
from infera_core.server.dashboard import add_dashboard_routes
from infera_core.server.decisions import DecisionLog
from infera_core.server.errors import ApiError
from infera_core.server.fleet import EndpointTable
from infera_core.server.global_budgets import GlobalBudgets
from infera_core.server.hangs import HangDetector
from infera_core.server.keys import KeyRing, Principal
from infera_core.server.kv import KvComponent
from infera_core.server.liveness import progress
from infera_core.server.messages import MessagesProxy
from infera_core.server.metrics import ServerMetrics
from infera_core.server.observed import ACCESS_LOG_STATE
from infera_core.server.openapi import add_openapi_route
from infera_core.server.pd import build_pd
from infera_core.server.pooling import add_pooling_routes
from infera_core.server.proxy import OpenAIProxy
from infera_core.server.queue import RouterQueue
from infera_core.server.response_owners import ResponseOwners
from infera_core.server.responses import ResponsesProxy
from infera_core.server.responses_routes import add_responses_routes
from infera_core.server.resume import Migrator
from infera_core.server.routing_mode import RoutingModes
from infera_core.server.security_headers import ADMIN_PREFIXES, WithHeaders, security_headers
from infera_core.server.series import LeanCollector
from infera_core.server.settings import ServeSettings
from infera_core.server.tokenize_routes import add_tokenize_routes
from infera_core.server.tracing import Tracing, traces_endpoint
from infera_core.server.usage import UsageLedger
from infera_core.server.validate import BodyLimits, check_chat, check_completion
from infera_core.transports.base import ClientContext
from infera_core.transports.clients import Upstreams
from infera_core.util.redact import redact_url
from infera_core.worker import WorkerRecord

ANTHROPIC_PREFIX = "/v1/messages"
"""Routes whose errors are Anthropic-shaped (``{"type": "error", "error": {...}}``)."""


class InferaApp(FastAPI):
    """FastAPI with a fast path: ``POST`` to a hot route goes straight to its raw ASGI
    endpoint, skipping the middleware stack and route matching (measured: ~15% of the
    router's CPU per proxied request). Everything else is plain FastAPI."""

    hot_routes: dict[str, Any]
    admin_headers: list[tuple[bytes, bytes]] = security_headers()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if scope["method"] == "POST":
                endpoint = self.hot_routes.get(scope["path"])
                if endpoint is not None:
                    scope["app"] = self
                    await endpoint(scope, receive, send)
                    return
            if scope["path"].startswith(ADMIN_PREFIXES):  # browser security headers (admin pages)
                send = WithHeaders(send, self.admin_headers)
        await super().__call__(scope, receive, send)


def make_discovery(settings: ServeSettings, hooks: InferaHooks) -> Discovery:
    factory = hooks.require("discovery_backend", settings.discovery)
    return factory.create(DiscoverySettings.of(settings))


def _error(status: int, message: str, code: str | None = None, path: str = "") -> Response:
    """An error answer: Anthropic's shape on ``/v1/messages*``, OpenAI's elsewhere."""
    err = ApiError(status, message, code=code)
    if path.startswith(ANTHROPIC_PREFIX):
        return anthropic_error(err)
    return JSONResponse(err.payload(), status_code=status)


def create_app(
    settings: ServeSettings,
    hooks: InferaHooks,
    *,
    discovery: Discovery | None = None,
    kv: KvComponent | None = None,
    start_discovery: bool | None = None,
) -> FastAPI:
    """Build the server. Configuration errors raise :class:`ConfigError` here, not at serve time.

    ``discovery``: a backend to watch (default: built from ``settings.discovery``).
    ``start_discovery``: whether the lifespan starts/closes it (default: only when
    it built the backend itself).
    """
    catalog = hooks.catalog()
    config = (
        load_router_config(settings.router_config)
        if settings.router_config
        else RouterConfig(preset=settings.router_policy or default_policy(catalog.policies))
    )
    table = EndpointTable()
    metrics = ServerMetrics()
    deps = SchedulerDeps(
        kv_index=kv.index if kv is not None else None,
        clock=time.monotonic,
        session_headers=tuple(h.lower() for h in settings.session_header),
    )
    scheduler = build_scheduler(
        table,
        config,
        catalog.policies,
        deps,
        direct=settings.router_mode == "direct",
        max_inflight=settings.max_inflight_per_worker,
        observe=metrics.decided,
        notify=hooks.request_routed_notifier(),
    )
    breakers = Breakers(settings.breaker_failures, settings.breaker_cooldown)
    metrics.watch_fleet(lambda: list(table.by_id.values()), breakers.state)
    metrics.watch_latency(deps.latency)
    upstream = Upstreams(
        catalog.request_transports,
        ClientContext(
            connect_timeout=settings.connect_timeout,
            first_byte_timeout=settings.first_byte_timeout,
            idle_timeout=settings.stream_idle_timeout,
            max_connections=settings.upstream_connections,
            pool_timeout=settings.pool_timeout,
            http_client=settings.http_client,
            options=BackendOptions(settings),
        ),
        eager=["http", settings.request_transport],
    )
    table.upstream_for = upstream.for_record
    core = RouterCore(table, scheduler, upstream, breakers, metrics, settings.request_max_retries)
    hangs = core.hangs = HangDetector(
        breakers,
        lambda: table.by_id.values(),
        settings.hang_timeout,
        settings.hang_factor,
        on_trip=lambda ep: metrics.breaker_opened.inc(),
        probe=progress,
    )
    core.pd = build_pd(core, config.pd, catalog, deps, settings.max_inflight_per_worker)
    queue = core.queue = _router_queue(settings, core, kv)
    core.salting.index = deps.kv_index
    metrics.registry.register(LeanCollector([core.salting.tokens]))
    owns_discovery = discovery is None if start_discovery is None else start_discovery
    disc = discovery if discovery is not None else make_discovery(settings, hooks)
    if kv is not None:
        kv.use_card_store(disc)
        table.add_listener(kv.on_worker_added, kv.on_worker_removed)
        core.prepare = kv.prepare
        kv.register_metrics(metrics.registry)

    def forget(record: WorkerRecord) -> None:
        breakers.forget(record.worker_id)
        hangs.forget(record.worker_id)

    table.add_listener(on_removed=forget)
    modes = RoutingModes(
        scheduler.profile_for, kv.tokenizer_missing if kv is not None else None, table.models
    )
    table.add_listener(modes.on_worker_added)
    metrics.registry.register(modes)
    core.routing_modes = modes

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if owns_discovery:
                await disc.start()
                stack.push_async_callback(disc.close)
            await upstream.start()
            stack.push_async_callback(upstream.close)
            if kv is not None:
                await kv.start()
                stack.push_async_callback(kv.stop)
            view = FleetView(disc, hooks=hooks)
            view.subscribe(table.apply)
            await view.start(wait_synced=settings.connect_timeout)
            stack.push_async_callback(view.stop)
            if auth is not None and settings.global_budgets and isinstance(disc, SharedState):
                budgets = GlobalBudgets(disc, core.router_id)  # one budget for the cluster's routers
                await budgets.start()
                auth.ring.share(budgets)
                stack.push_async_callback(budgets.close)
            stack.push_async_callback(app.state.dashboard.close)
            stack.push_async_callback(responses.locator.close)
            stack.callback(queue.close)
            if queue.refresh is not None:  # engine thresholds: their numbers, scraped all along
                watcher = asyncio.ensure_future(app.state.dashboard.watch())
                stack.callback(watcher.cancel)
            if app.state.tracing is not None:
                stack.callback(app.state.tracing.shutdown)  # the spans still buffered are sent
            yield

    app = InferaApp(title="Infera", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.core = core
    app.state.settings = settings
    limit = BodyLimits.of(settings)
    responses = ResponsesProxy(core, limit, ResponseOwners())
    app.hot_routes = {
        "/v1/chat/completions": OpenAIProxy(core, "/v1/chat/completions", check_chat, limit),
        "/v1/completions": OpenAIProxy(core, "/v1/completions", check_completion, limit),
        "/v1/messages": MessagesProxy(core, limit),
        "/v1/responses": responses,
    }
    admin = AdminGate(settings.admin_token.get_secret_value() if settings.admin_token else None)
    auth = _client_auth(settings, admin, metrics)
    setattr(app.state, ADMIN_STATE, admin)
    setattr(app.state, CLIENT_STATE, auth)
    migrator = Migrator(
        core,
        settings.migration_limit,
        {m: c.migration_limit for m, c in config.models.items() if c.migration_limit is not None},
        settings.drain_grace,
    )
    table.add_listener(migrator.on_worker_changed, migrator.on_worker_removed)

    def tripped(ep: Endpoint) -> None:  # a hung worker: out of rotation, its streams moved
        metrics.breaker_opened.inc()
        migrator.on_hung(ep)

    hangs.on_trip = tripped
    access = (
        AccessLog(settings.access_log, settings.access_log_sample) if settings.access_log != "off" else None
    )
    setattr(app.state, ACCESS_LOG_STATE, access)  # the routes FastAPI handlers answer log too
    decisions = core.decisions = DecisionLog(settings.decisions_kept, settings.decisions_sample)
    otlp = traces_endpoint(settings.otlp_traces_endpoint)
    tracing = app.state.tracing = Tracing(otlp, settings.otlp_traces_sample) if otlp else None
    for endpoint in app.hot_routes.values():
        endpoint.auth, endpoint.admin, endpoint.migrator = auth, admin, migrator
        endpoint.access_log, endpoint.decisions, endpoint.tracing = access, decisions, tracing
    # the same endpoints through the ordinary router too (405 for other methods)
    app.router.routes.extend(Route(path, ep, methods=["POST"]) for path, ep in app.hot_routes.items())
    _control_routes(app, core, kv, auth, settings.public_metrics)
    add_tokenize_routes(app, core, limit)
    add_pooling_routes(app, core, limit)
    add_count_tokens_route(app, core, kv, limit)
    add_responses_routes(app, responses.locator)
    add_openapi_route(app)
    app.state.dashboard = add_dashboard_routes(app, core, kv)
    if settings.queue_engine_waiting or settings.queue_engine_kv_usage:
        queue.refresh = app.state.dashboard.poke  # the engines' numbers, while requests wait
    _error_handlers(app)
    return app


def _router_queue(settings: ServeSettings, core: RouterCore, kv: KvComponent | None) -> RouterQueue:
    """The router queue (``--queue-*``) and the saturation signal it waits on."""
    core.headroom = settings.queue_headroom
    core.scheduler.waiting_max = settings.queue_engine_waiting
    core.scheduler.kv_usage_max = settings.queue_engine_kv_usage
    engine_signal = bool(settings.queue_engine_waiting or settings.queue_engine_kv_usage)
    queue = RouterQueue(
        core.schedule_limited,
        core.unqueued,
        core.slots,
        max_len=settings.queue_max,
        timeout=settings.queue_timeout,
        output_cap=settings.queue_output_cap,
        # a slot freed in another process, or an engine's numbers, change without a local event
        recheck=engine_signal or settings.processes != 1,
        kv_index=kv.index if kv is not None else None,
    )
    queue.headroom = settings.queue_headroom > 0 and settings.max_inflight_per_worker > 0
    if settings.queue_tier_window > 0:
        queue.tier_guard = (settings.queue_tier_window, settings.queue_tier_share, core.workers)
    queue.register_metrics(core.metrics.registry)
    return queue


def _client_auth(settings: ServeSettings, admin: AdminGate, metrics: ServerMetrics) -> ClientAuth | None:
    """API keys when ``--api-key-file`` is set (a bad file is a ConfigError now, not later)."""
    if settings.api_key_file is None:
        return None
    ledger = UsageLedger()
    metrics.registry.register(LeanCollector([ledger.tokens, ledger.cached]))
    return ClientAuth(KeyRing(settings.api_key_file), admin, ledger, settings.budget_max_tokens)


def _control_routes(
    app: FastAPI,
    core: RouterCore,
    kv: KvComponent | None = None,
    auth: ClientAuth | None = None,
    public_metrics: bool = False,
) -> None:
    table = core.table
    worker_fields = kv.worker_fields if kv is not None else None
    admin_only = [Depends(require_admin)]

    @app.get("/v1/models")
    async def models(principal: Principal | None = Depends(client_principal)) -> dict[str, Any]:
        allowed = principal.key.allowed if principal is not None and principal.key is not None else None
        data = []
        for model in table.models():
            if allowed is not None and model not in allowed:
                continue
            eps = table.every.get(model) or []
            created = int(min((ep.record.started_at for ep in eps), default=0))
            entry: dict[str, Any] = {"id": model, "object": "model", "created": created, "owned_by": "infera"}
            base = table.lora_base.get(model)
            if base is not None:  # a LoRA adapter, listed as vLLM lists it
                entry["parent"] = base
            data.append(entry)
        return {"object": "list", "data": data}

    @app.get("/health")
    async def health() -> JSONResponse:
        active = table.active_count()
        body = {
            "status": "ok" if active else "no workers",
            "active_workers": active,
            "models": table.models(),
        }
        return JSONResponse(body, status_code=200 if active else 503)

    @app.get("/v1/workers", dependencies=admin_only)
    async def workers() -> dict[str, Any]:
        out = []
        for ep in sorted(table.by_id.values(), key=lambda e: e.worker_id):
            rec = ep.record
            out.append(
                {
                    "worker_id": ep.worker_id,
                    "url": redact_url(rec.url),
                    "model": rec.model,
                    "engine": rec.engine,
                    "role": str(rec.role),
                    "status": str(rec.status),
                    "dp_rank": rec.dp_rank,
                    "dp_size": rec.dp_size,
                    "labels": rec.labels,
                    "lora_adapters": rec.lora_adapters,
                    "tasks": rec.tasks,
                    "in_flight": ep.in_flight,
                    "picks": ep.picks,
                    "breaker": core.breakers.state(ep),
                    "routing_mode": core.routing_modes.mode(rec.model) if core.routing_modes else None,
                    **(worker_fields(ep.worker_id) if worker_fields is not None else {}),
                }
            )
        return {"object": "list", "data": out}

    @app.get("/v1/admin/usage", dependencies=admin_only)
    async def usage() -> Response:
        if auth is None:
            return _error(404, "Usage per API key needs --api-key-file.", "api_keys_disabled")
        return JSONResponse(auth.usage())

    @app.get("/v1/admin/decisions", dependencies=admin_only)
    async def decisions() -> dict[str, Any]:
        log = core.decisions
        return {"object": "list", "data": log.recent() if log is not None else []}

    @app.get("/v1/admin/cache-view/{worker_id}", dependencies=admin_only)
    async def cache_view(worker_id: str) -> Response:
        if kv is None:
            return _error(404, "KV routing is not enabled on this server.", "kv_routing_disabled")
        if table.get(worker_id) is None:
            return _error(404, f"Unknown worker {worker_id!r}.", "worker_not_found")
        return JSONResponse(kv.cache_view(worker_id))

    @app.get("/metrics", dependencies=[] if public_metrics else admin_only)
    async def metrics() -> Response:
        return Response(generate_latest(core.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        if request.url.path.startswith(ANTHROPIC_PREFIX):
            return anthropic_error(exc)
        return JSONResponse(exc.payload(), status_code=exc.status, headers=exc.headers or None)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        path = request.url.path
        if exc.status_code == 404:
            return _error(404, f"Unknown route {request.method} {path}.", "unknown_route", path)
        if exc.status_code == 405:
            resp = _error(
                405, f"Method {request.method} is not allowed on {path}.", "method_not_allowed", path
            )
            resp.headers.update(exc.headers or {})  # Allow: the route's methods
            return resp
        return _error(exc.status_code, str(exc.detail), path=path)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return _error(400, f"Invalid request: {exc.errors()[:1]}", path=request.url.path)

"""OpenTelemetry traces of the requests the router serves (``--otlp-traces-endpoint``).

An optional extra (``pip install 'infera-core[tracing]'``: ``opentelemetry-sdk`` and the OTLP
exporter), imported only when tracing is on; off, nothing of it is loaded and a request pays
one ``is None`` test. On, each request gets a span (``infera.request``, kind SERVER, child of
the client's W3C ``traceparent`` when it sent one) with its model, API key *name*, worker,
attempts, TTFT and tokens, and child spans for tokenizing (``infera.tokenize``), each routing
decision (``infera.route``: policy, pick, the candidates' score terms as bounded JSON) and each
upstream call (``infera.upstream``, kind CLIENT, until the answer was relayed). The upstream
span's ``traceparent`` goes to the engine, so an engine that traces (vLLM
``--otlp-traces-endpoint``) puts its own spans in the same trace.

Configuration: ``--otlp-traces-endpoint URL`` (an OTLP/HTTP collector, e.g.
``http://collector:4318``; ``/v1/traces`` is added when the URL has no path), else the standard
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``;
``--otlp-traces-sample RATE`` (a client's sampled ``traceparent`` is always followed);
``OTEL_SERVICE_NAME`` (default ``infera-router``), ``OTEL_RESOURCE_ATTRIBUTES`` and
``OTEL_EXPORTER_OTLP_HEADERS`` as the SDK reads them.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from infera_core.errors import ConfigError
from infera_core.server.decisions import compact

TRACEPARENT = b"traceparent"
TRACESTATE = b"tracestate"
_MAX_ATTR = 4096
"""Longest string attribute (the candidates' terms are cut beyond it)."""


def traces_endpoint(flag: str | None) -> str | None:
    """The OTLP/HTTP traces URL: the flag, else the standard OTEL variables; None: tracing off."""
    if flag:
        parts = urlsplit(flag)
        return flag if parts.path not in ("", "/") else flag.rstrip("/") + "/v1/traces"
    env = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if env:
        return env
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return base.rstrip("/") + "/v1/traces" if base else None


class RequestTrace:
    """One request's spans (on ``ctx.trace``)."""

    __slots__ = ("context", "root", "tracer", "upstream")

    def __init__(self, tracer: Any, root: Any, context: Any) -> None:
        self.tracer = tracer
        self.root = root
        self.context = context
        """The OTel context holding ``root``: the parent of every child span."""
        self.upstream: Any = None
        """The open ``infera.upstream`` span of the attempt that answered (ended on release)."""

    def child(self, name: str, client: bool = False) -> Any:
        from opentelemetry.trace import SpanKind

        kind = SpanKind.CLIENT if client else SpanKind.INTERNAL
        return self.tracer.start_span(name, context=self.context, kind=kind)

    @staticmethod
    def traceparent(span: Any) -> str:
        """W3C ``traceparent`` of ``span`` (what the engine continues)."""
        sc = span.get_span_context()
        return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"

    def open_upstream(self, worker: str, attempt: int) -> str:
        """Start the ``infera.upstream`` span of one attempt; its ``traceparent`` for the engine."""
        self.end_upstream(False)  # an earlier attempt's, if it was not ended
        span = self.upstream = self.child("infera.upstream", client=True)
        span.set_attribute("infera.worker", worker)
        span.set_attribute("infera.attempt", attempt + 1)
        return self.traceparent(span)

    def end_upstream(self, ok: bool) -> None:
        span = self.upstream
        if span is not None:
            self.upstream = None
            if not ok:
                from opentelemetry.trace import Status, StatusCode

                span.set_status(Status(StatusCode.ERROR))
            span.end()


class Tracing:
    """The router's tracer provider and exporter (one per server process)."""

    def __init__(self, endpoint: str, sample: float) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            raise ConfigError(
                "--otlp-traces-endpoint needs OpenTelemetry: pip install 'infera-core[tracing]'"
                " (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)"
            ) from None
        service = os.environ.get("OTEL_SERVICE_NAME") or "infera-router"
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": service}),
            sampler=ParentBased(TraceIdRatioBased(sample)),
        )
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = self.provider.get_tracer("infera")
        self._propagator = TraceContextTextMapPropagator()

    def start(self, scope: Any, route: str) -> RequestTrace:
        """The request's root span, child of the client's ``traceparent`` when it sent one."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        carrier: dict[str, str] = {}
        for name, value in scope["headers"]:
            if name in (TRACEPARENT, TRACESTATE):
                carrier[name.decode()] = value.decode("latin-1")
        parent = self._propagator.extract(carrier) if carrier else None
        root = self.tracer.start_span(
            "infera.request",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": "POST", "http.route": route},
        )
        return RequestTrace(self.tracer, root, set_span_in_context(root))

    def shutdown(self) -> None:
        """Export what is buffered and stop (the server's shutdown)."""
        self.provider.shutdown()


def bounded(text: str) -> str:
    return text if len(text) <= _MAX_ATTR else text[: _MAX_ATTR - 1] + "…"


async def traced_prepare(prepare: Callable[[Any], Awaitable[None]], ctx: Any, tr: RequestTrace) -> None:
    """Tokenizing for routing inside an ``infera.tokenize`` span."""
    span = tr.child("infera.tokenize")
    try:
        await prepare(ctx)
    finally:
        span.set_attribute("infera.tokens", len(ctx.token_ids or ()))
        span.set_attribute("infera.tokenize_failed", bool(ctx.tokenize_failed))
        span.end()


def traced_schedule(
    schedule: Callable[[Any, list[str]], Any], ctx: Any, tried: list[str], tr: RequestTrace
) -> Any:
    """``schedule(ctx, tried)`` inside an ``infera.route`` span carrying the decision's terms
    (recorded in ``ctx.explain``)."""
    with _route_span(tr) as span:
        ep = schedule(ctx, tried)
    _route_done(span, ctx, ep)
    return ep


async def traced_acquire(acquire: Awaitable[Any], ctx: Any, tr: RequestTrace) -> Any:
    """The router queue's ``acquire`` (a decision, after a wait when every worker is busy)
    inside an ``infera.route`` span, as :func:`traced_schedule`."""
    with _route_span(tr) as span:
        ep = await acquire
    _route_done(span, ctx, ep)
    return ep


@contextmanager
def _route_span(tr: RequestTrace) -> Iterator[Any]:
    """An ``infera.route`` span; ended here, with the error, when the decision raises (else by
    :func:`_route_done`)."""
    span = tr.child("infera.route")
    try:
        yield span
    except BaseException as exc:
        span.set_attribute("infera.error", bounded(str(exc)))
        span.end()
        raise


async def traced_pair(pick: Awaitable[Any], tr: RequestTrace) -> Any:
    """A PD pair's choice (after a wait in the router queue, maybe) inside an ``infera.route``
    span naming both workers."""
    with _route_span(tr) as span:
        pair = await pick
    span.set_attribute("infera.worker", pair.decode.worker_id)
    span.set_attribute("infera.prefill_worker", pair.prefill.worker_id)
    span.end()
    return pair


@contextmanager
def prefill_span(
    tr: RequestTrace | None, headers: dict[str, str], worker: str, attempt: int
) -> Iterator[None]:
    """A PD prefill leg inside an ``infera.pd.prefill`` span (CLIENT); its ``traceparent``
    goes into the leg's ``headers`` so the prefill engine joins the trace. Nothing when off."""
    if tr is None:
        yield
        return
    span = tr.child("infera.pd.prefill", client=True)
    span.set_attribute("infera.worker", worker)
    span.set_attribute("infera.attempt", attempt + 1)
    headers["traceparent"] = tr.traceparent(span)
    try:
        yield
    except BaseException:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR))
        raise
    finally:
        span.end()


def decode_span(tr: RequestTrace | None, headers: dict[str, str], worker: str, attempt: int) -> None:
    """A PD decode leg's ``infera.upstream`` span (ended when the relay ends, as a mixed
    request's), marked ``infera.pd.role=decode``; its ``traceparent`` goes into ``headers``."""
    if tr is not None:
        headers["traceparent"] = tr.open_upstream(worker, attempt)
        tr.upstream.set_attribute("infera.pd.role", "decode")


def _route_done(span: Any, ctx: Any, ep: Any) -> None:
    decision = ctx.explain
    if decision is not None and decision.attempt:
        span.set_attribute("infera.policy", decision.policy)
        span.set_attribute("infera.attempt", decision.attempt)
        span.set_attribute("infera.decision", bounded(compact(decision, _MAX_ATTR).decode()))
    span.set_attribute("infera.worker", ep.worker_id)
    span.end()


def end_request(tr: RequestTrace, ctx: Any, model: str, status: int) -> None:
    """The root span's attributes (never a prompt or a key: the key's name) and its end."""
    root = tr.root
    tr.end_upstream(status < 400)
    if root.is_recording():
        attrs: dict[str, Any] = {"infera.model": model, "http.response.status_code": status}
        if ctx is not None:
            attrs["infera.request_id"] = ctx.request_id
            name = getattr(ctx.principal, "name", None)
            if name:
                attrs["infera.key"] = name
            rec = ctx.access
            if rec is not None:
                if rec.worker:
                    attrs["infera.worker"] = rec.worker
                attrs["infera.retries"] = rec.retries
                if rec.ttft is not None:
                    attrs["infera.ttft_ms"] = round(rec.ttft * 1000, 2)
                attrs["gen_ai.usage.input_tokens"] = rec.prompt
                attrs["gen_ai.usage.output_tokens"] = rec.completion
                attrs["infera.cached_tokens"] = rec.cached
        root.set_attributes(attrs)
        if status >= 500:
            from opentelemetry.trace import Status, StatusCode

            root.set_status(Status(StatusCode.ERROR))
    root.end()

"""The two transport seams: how requests reach a worker, and how its KV events reach routers.

Both are registries filled by catalog hooks (``infera_register_request_transports``,
``infera_register_kv_event_transports``), like engines and policies. Core registers
``http`` (request transport; its client is ``--http-client native|aiohttp``) and
``zmq`` (KV events); the ``infera-nats`` plugin registers ``nats`` for both.

**Which transport reaches a worker** is in its record: ``WorkerRecord.request_transport``
(default ``"http"``) and ``WorkerRecord.kv_event_transport`` (default ``"zmq"``), with
transport-specific parameters in ``request_params`` / ``kv_event_params`` (a NATS subject,
a stream name…). One router serves a mixed fleet: it keeps one client per request
transport (:class:`infera_core.transports.upstreams.Upstreams`) and sets
``Endpoint.upstream`` when a record arrives, so the hot path is ``ep.upstream.open(...)``
(one attribute read, no lookup per request). A record naming a transport this router
does not have is logged and not routed.

**Worker side.** The launcher calls ``attach_worker(ctx)`` of the transports its worker
uses (``--request-transport``, ``--kv-event-transport``) once the engine serves and before
it registers; the returned :class:`WorkerAttachment` adds fields to the record (e.g.
``{"request_params": {"subject": ...}}``) and is closed after deregistration. ``http``
and ``zmq`` attach nothing (the engine is reached directly): they return None.

**Router side.** Request transport: ``create_client(ctx) -> Upstream`` (the
:class:`infera_core.transports.upstreams.Upstream` protocol: ``start``/``close``/``open``;
``open`` must be safe to call before ``start`` returned, waiting for readiness up to
``ctx.connect_timeout`` and raising the retryable ``UpstreamError`` when not ready). KV
events: ``create_source(ctx) -> KvEventSource``, one per router process, ``zmq`` included
(:class:`infera_core.transports.zmq.ZmqKvEventSource`). A source delivers ``(seq, payload)``
batches of one publisher to a :class:`KvEventSink`; the hub does sequencing, gap detection,
decoding and indexing alike for every transport, and calls ``source.replay`` to fill a gap.
(A factory returning None, which once meant "the hub's built-in ZMQ subscriber", still gets
the ``zmq`` transport's source, with a deprecation warning, until the next release.)

Contract suites: :class:`infera_core.testing.contracts.RequestTransportContract` and
:class:`~infera_core.testing.contracts.KvEventTransportContract`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from infera_core.config.backends import BackendOptions
from infera_core.registry import Registry

if TYPE_CHECKING:
    from pydantic import BaseModel

    from infera_core.transports.upstreams import Upstream
    from infera_core.worker import KvEventsInfo, WorkerRecord

HTTP = "http"
ZMQ = "zmq"


@dataclass(frozen=True, slots=True)
class ClientContext:
    """What a router-side request transport client is built from (``serve`` settings)."""

    connect_timeout: float = 5.0
    first_byte_timeout: float = 600.0
    idle_timeout: float = 300.0
    """Seconds without a byte of a streaming response before it is abandoned."""
    max_connections: int = 4096
    pool_timeout: float = 10.0
    """Seconds a request may wait for a free connection (HTTP pool)."""
    http_client: str = "native"
    """``--http-client``: which HTTP client the ``http`` transport uses."""
    options: BackendOptions = field(default_factory=BackendOptions)


@dataclass(frozen=True, slots=True)
class KvSourceContext:
    """What a router-side KV event source is built from."""

    connect_timeout: float = 5.0
    replay_timeout: float = 2.0
    max_message_bytes: int = 16 * 1024 * 1024
    """Largest message accepted from a publisher (``--kv-max-message-bytes``; 0: unlimited)."""
    reconnect_max_s: float = 5.0
    """Longest backoff between reconnects to a publisher (``--kv-reconnect-max-s``)."""
    options: BackendOptions = field(default_factory=BackendOptions)


@dataclass(slots=True)
class WorkerContext:
    """What the worker-side part of a transport needs (the launcher builds it)."""

    worker_id: str
    model: str
    engine_url: str
    """The engine's own base URL (``http://127.0.0.1:PORT``): where a responder forwards."""
    kv_events: KvEventsInfo | None = None
    """The engine's local KV publisher (ZMQ), when it publishes events."""
    dp_size: int = 1
    connect_timeout: float = 5.0
    options: BackendOptions = field(default_factory=BackendOptions)


@runtime_checkable
class WorkerAttachment(Protocol):
    """A running worker-side part (a responder, a relay) and what it adds to the record."""

    @property
    def record_fields(self) -> dict[str, Any]:
        """Merged into the worker record before registration (top-level record fields)."""
        ...

    async def close(self) -> None:
        """Stop; called after the worker deregistered (in-flight work has drained)."""
        ...


@runtime_checkable
class RequestTransportFactory(Protocol):
    """A request transport (``http``, ``nats``…), registered by name."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def settings_model(self) -> type[BaseModel] | None:
        """Its own settings (fields become flags / ``INFERA_*`` vars); None for none."""
        ...

    def create_client(self, ctx: ClientContext) -> Upstream:
        """The router's client for every worker reached by this transport (one per process)."""
        ...

    async def attach_worker(self, ctx: WorkerContext) -> WorkerAttachment | None:
        """Start the worker-side part (None when the engine is reached directly)."""
        ...


@runtime_checkable
class KvEventSink(Protocol):
    """Where a :class:`KvEventSource` delivers one publisher's batches (the KV hub).

    A source needs only ``batch`` and ``malformed``; the rest is for sources that see more
    of the publisher's connection (``zmq``)."""

    async def batch(self, seq: int, payload: bytes) -> None:
        """One batch with its publisher sequence number (gaps and restarts are handled here)."""
        ...

    def malformed(self, reason: str) -> None:
        """A message that is not a batch (counted and logged by the hub, then skipped)."""
        ...

    @property
    def last_seq(self) -> int | None:
        """The last seq the hub applied from this publisher (None before the first): a
        publisher that does not number its batches is numbered after it."""
        ...

    def bad_seq(self, what: str) -> None:
        """A frame whose seq cannot be trusted (``what`` says why): counted, logged, skipped."""
        ...

    def dropped(self, reason: str) -> None:
        """The connection to the publisher dropped (``reason``: the likely causes) and is
        being made again: what it sent in between is lost (a gap, or a cleared view)."""
        ...

    async def subscribed(self, replayable: bool) -> None:
        """The source now receives the publisher's live batches. ``replayable``: whether
        ``replay`` can read its history (when False, a router that joins late does not ask).
        The hub loads the history first when it has seen no batch yet (initial sync). A
        source that never calls this is taken as replayable, without an initial sync."""
        ...


@runtime_checkable
class KvEventSource(Protocol):
    """Router side of a KV-event transport: one object per router process."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def follow(self, record: WorkerRecord, rank: int | None, sink: KvEventSink) -> None:
        """Deliver the batches of ``record``'s publisher (DP rank ``rank`` when the worker
        publishes per rank, else None) to ``sink`` until cancelled. Raise on a broken
        connection: the hub logs it and calls ``follow`` again with backoff."""
        ...

    async def replay(
        self, record: WorkerRecord, rank: int | None, start: int, until: int
    ) -> list[tuple[int, bytes]] | None:
        """Batches with ``start <= seq < until`` still available, in order; None when the
        history cannot be read (the hub then clears the worker's view)."""
        ...


@runtime_checkable
class KvEventTransportFactory(Protocol):
    """A KV-event transport (``zmq``, ``nats``…), registered by name."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def settings_model(self) -> type[BaseModel] | None: ...

    def create_source(self, ctx: KvSourceContext) -> KvEventSource | None:
        """The router-side source (one per router process).

        Return a source: None (once "the hub's built-in ZMQ subscriber") is deprecated and
        gets the ``zmq`` transport's source, with a warning, until the next release."""
        ...

    async def attach_worker(self, ctx: WorkerContext) -> WorkerAttachment | None:
        """Start the worker-side part (a relay); None when routers read the engine directly."""
        ...


@dataclass(frozen=True, slots=True)
class Attached:
    """A plain :class:`WorkerAttachment` for transports whose worker side is only record fields."""

    record_fields: dict[str, Any] = field(default_factory=dict)

    async def close(self) -> None:
        return None


class RequestTransportRegistry(Registry[RequestTransportFactory]):
    kind = "request transport"
    protocol = RequestTransportFactory


class KvEventTransportRegistry(Registry[KvEventTransportFactory]):
    kind = "KV-event transport"
    protocol = KvEventTransportFactory

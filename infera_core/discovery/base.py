"""The discovery contract: register workers (launcher side), watch the fleet (server side)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from pydantic import Field

from infera_core.config.backends import BackendOptions
from infera_core.registry import Registry
from infera_core.worker import DEFAULT_PREFIX, WorkerRecord


def etcd_endpoint_field() -> Any:
    """``--etcd-endpoint`` of the commands that reach discovery by one flag (``worker``,
    ``workers``): a comma list, read by :meth:`DiscoverySettings.of`."""
    return Field(None, description="etcd endpoint(s): host:port, http://host:port, or a comma list.")


def discovery_prefix_field() -> Any:
    """``--discovery-prefix`` (alias ``--etcd-prefix``) of ``worker`` and ``workers``."""
    return Field(
        DEFAULT_PREFIX,
        description="Key prefix of worker records (the same as serve's).",
        json_schema_extra={"aliases": ["--etcd-prefix"], "old_env": ["INFERA_ETCD_PREFIX"]},
    )


def discovery_timeout_field(description: str) -> Any:
    """``--discovery-timeout`` of ``worker`` and ``workers`` (once ``--connect-timeout``)."""
    return Field(
        5.0, gt=0, description=description, json_schema_extra={"old_env": ["INFERA_CONNECT_TIMEOUT"]}
    )


class ChangeKind(StrEnum):
    PUT = "put"
    DELETE = "delete"
    SYNCED = "synced"
    """Only with ``watch(sync_marker=True)``: the view now equals the backend's content
    (after the initial PUTs, and again after every resynchronisation). ``record`` is None."""


@dataclass(frozen=True, slots=True)
class FleetChange:
    """One change in the fleet. ``record`` is the last known record (also for deletes)."""

    kind: ChangeKind
    worker_id: str
    record: WorkerRecord | None


@dataclass(slots=True)
class DiscoverySettings:
    """What every backend may need; each uses the parts it understands.

    ``prefix``, ``lease_ttl`` and ``connect_timeout`` are common to all backends. A
    backend's own settings (its ``settings_model``) come from ``options``:
    ``settings.options.get(MySettings)``. The etcd, static and memory fields below are
    core's backends' and stay here for the code that builds them directly.
    """

    etcd_endpoints: list[str] = field(default_factory=list)
    prefix: str = DEFAULT_PREFIX
    lease_ttl: float = 10.0
    static_file: str | None = None
    connect_timeout: float = 5.0
    static_poll_interval: float = 1.0
    """How often the static backend checks its file's mtime (seconds)."""
    memory_store: object | None = None
    """The memory backend's store (:class:`infera_core.discovery.memory.MemoryStore`);
    None means the process-wide default store."""
    options: BackendOptions = field(default_factory=BackendOptions)
    """Settings models of plugin backends (see :mod:`infera_core.config.backends`)."""

    @classmethod
    def of(cls, source: object, **overrides: Any) -> DiscoverySettings:
        """From a command's settings (``serve``, ``worker``, ``up``, ``workers``): the fields
        they name alike (``etcd_endpoint`` as a list or a comma list, ``etcd_prefix`` or
        ``discovery_prefix``, ``lease_ttl``, ``static_file``, ``discovery_timeout`` or
        ``connect_timeout``) plus every
        plugin backend's settings (``options``); ``overrides`` win."""
        raw = getattr(source, "etcd_endpoint", None) or []
        items = raw.split(",") if isinstance(raw, str) else list(raw)
        values: dict[str, Any] = {"etcd_endpoints": [e.strip() for e in items if e.strip()]}
        prefix = getattr(source, "discovery_prefix", None) or getattr(source, "etcd_prefix", None)
        if prefix:
            values["prefix"] = prefix
        for name in ("lease_ttl", "static_file", "connect_timeout"):
            if getattr(source, name, None) is not None:
                values[name] = getattr(source, name)
        if getattr(source, "discovery_timeout", None) is not None:  # worker, workers
            values["connect_timeout"] = source.discovery_timeout  # type: ignore[attr-defined]
        values["options"] = BackendOptions(source)
        values.update(overrides)
        return cls(**values)


@runtime_checkable
class Registration(Protocol):
    """A live registration of one worker (keeps its lease alive until closed)."""

    async def update(self, record: WorkerRecord) -> None:
        """Replace the published record (e.g. ``status=draining``)."""
        ...

    async def deregister(self) -> None:
        """Delete the record and stop heartbeats. Idempotent."""
        ...


@runtime_checkable
class Discovery(Protocol):
    async def start(self) -> None:
        """Connect; raise ``DiscoveryError`` with a clear message when unreachable."""
        ...

    async def close(self) -> None: ...

    async def register(self, record: WorkerRecord) -> Registration:
        """Publish ``record`` (put-if-absent; duplicate ``worker_id`` is an error)."""
        ...

    async def list_workers(self) -> list[WorkerRecord]: ...

    def watch(self, *, sync_marker: bool = False) -> AsyncIterator[FleetChange]:
        """Initial PUTs for every current worker, then changes, forever (until close).

        With ``sync_marker=True`` a ``ChangeKind.SYNCED`` change follows the initial PUTs
        and every later full resynchronisation (after an etcd reconnect, a file reload).
        Malformed records are logged with their key and skipped.
        """
        ...


@runtime_checkable
class CardStore(Protocol):
    """A discovery backend that also keeps model cards (content-addressed bytes; see
    :mod:`infera_core.tokenize.card`). Optional: a backend without it publishes no cards,
    and routers then need ``--tokenizer``."""

    card_source: str
    """What goes in ``WorkerRecord.model_card.source`` (``etcd``, ``nats``, ``memory``)."""

    async def put_card(self, digest: str, data: bytes) -> None:
        """Store ``data`` under ``digest`` (idempotent). Called after the worker registered,
        so a concurrent :meth:`release_card` of another worker cannot drop it."""
        ...

    async def get_card(self, digest: str, max_bytes: int) -> bytes | None:
        """The card's bytes (None when absent); raises ``ValueError`` when it is larger
        than ``max_bytes``. The caller verifies the digest."""
        ...

    async def release_card(self, digest: str) -> None:
        """After a worker deregistered: drop the card when no worker record names it."""
        ...


@runtime_checkable
class SharedState(Protocol):
    """A discovery backend that also keeps small shared records with compare-and-swap, so
    the router replicas of one cluster can share state (API-key budgets:
    :mod:`infera_core.server.global_budgets`). Optional: without it each router keeps its own.

    ``name`` is made of ``[A-Za-z0-9_.-]``; the backend places it under its own prefix.
    Failures (store unreachable, timeouts) raise; callers treat any exception as "store lost".
    """

    state_source: str
    """Where the records live, for logs and docs (``etcd``, ``nats``, ``kubernetes``)."""

    async def state_get(self, name: str) -> tuple[bytes | None, int]:
        """The record ``name`` and its revision; ``(None, 0)`` when absent."""
        ...

    async def state_swap(self, name: str, value: bytes, revision: int) -> bool:
        """Write ``value`` if ``name``'s revision is still ``revision`` (0: absent); False when
        another writer came first (read again and retry)."""
        ...


@runtime_checkable
class DiscoveryFactory(Protocol):
    """A discovery backend, registered by name.

    Optional attribute ``settings_model``: a pydantic model of the backend's own settings
    (fields become flags and ``INFERA_*`` variables of ``serve``, ``worker``, ``up`` and
    ``workers``); ``create`` reads them with ``settings.options.get(that_model)``.
    """

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    def create(self, settings: DiscoverySettings) -> Discovery: ...


class DiscoveryRegistry(Registry[DiscoveryFactory]):
    kind = "discovery backend"
    protocol = DiscoveryFactory

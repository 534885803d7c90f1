"""The prefill/decode transport contract.

A PD transport (registered by an engine plugin through
``infera_register_pd_transports``) knows how one engine family moves KV from a
prefill worker to a decode worker: the bodies and headers of the two legs, and
their order. The router executes the protocol; transports only shape requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from infera_core.worker import WorkerRecord


class PdOrder(StrEnum):
    SERIAL = "serial"
    """Prefill first; its response (``kv_transfer_params``) feeds the decode leg."""
    CONCURRENT = "concurrent"
    """Both legs sent together; the decode pulls/receives the KV as it comes."""


@dataclass(slots=True)
class PdContext:
    """Per-request values the router makes once and both legs share."""

    request_id: str
    route: str
    """``/v1/chat/completions`` or ``/v1/completions``."""
    bootstrap_room: int | None = None
    transfer_id: str | None = None
    prefill_dp_rank: int | None = None
    decode_dp_rank: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class LegRequest:
    """One leg of a PD request: the body to POST and extra headers."""

    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    path: str | None = None
    """Override the route (None = same route as the client request)."""


class PdUnsupported(ValueError):
    """The request cannot go through this protocol (e.g. chat on ATOM PD): a clear 400."""


@runtime_checkable
class PdTransport(Protocol):
    @property
    def name(self) -> str:
        """Matches ``pd.protocol`` in worker records."""
        ...

    @property
    def order(self) -> PdOrder: ...

    def prepare(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> None:
        """Fill per-request values in ``ctx`` (bootstrap room, transfer id…). Raise PdUnsupported."""
        ...

    def prefill_request(
        self, body: dict[str, Any], ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord
    ) -> LegRequest:
        """The prefill leg, built from the client's body (never mutate ``body``)."""
        ...

    def decode_request(
        self,
        body: dict[str, Any],
        ctx: PdContext,
        prefill: WorkerRecord,
        decode: WorkerRecord,
        prefill_response: dict[str, Any] | None,
    ) -> LegRequest:
        """The decode leg. ``prefill_response`` is the parsed prefill reply for serial order."""
        ...

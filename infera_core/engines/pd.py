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
from urllib.parse import urlsplit

from infera_core.registry import Registry
from infera_core.worker import DP_RANK_HEADER, WorkerRecord


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
class PdProtocol(Protocol):
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


PdTransport = PdProtocol
"""The old name of :class:`PdProtocol`, kept for one release."""


class PdPairError(ValueError):
    """A prefill worker and a decode worker that cannot form a PD pair."""


def check_pair(prefill: WorkerRecord, decode: WorkerRecord) -> None:
    """Refuse a prefill/decode pair that cannot exchange KV (pure; used by router and launcher).

    Both must be the same engine and speak the same PD protocol, and serve the same model.
    Raises :class:`PdPairError` with a message naming both workers.
    """
    p, d = prefill, decode
    if p.engine != d.engine:
        raise PdPairError(
            f"PD pair refused: prefill {p.worker_id} runs {p.engine} but decode {d.worker_id} runs "
            f"{d.engine}; prefill and decode must be the same engine"
        )
    p_proto = p.pd.protocol if p.pd else None
    d_proto = d.pd.protocol if d.pd else None
    if p_proto is None or p_proto != d_proto:
        raise PdPairError(
            f"PD pair refused: prefill {p.worker_id} speaks {p_proto or 'no PD protocol'} but decode "
            f"{d.worker_id} speaks {d_proto or 'no PD protocol'}; both need the same pd.protocol"
        )
    if p.model != d.model:
        raise PdPairError(
            f"PD pair refused: prefill {p.worker_id} serves {p.model!r} but decode {d.worker_id} "
            f"serves {d.model!r}"
        )


def one_token_prefill_body(body: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of the client's ``body`` shaped for a prefill leg that computes KV only.

    ``max_tokens=1`` and ``max_completion_tokens=1``, ``stream=false``, no
    ``stream_options``, no ``min_tokens``; ``kv_transfer_params`` set when given.
    ``body`` itself is never changed.
    """
    out = dict(body)
    out["max_tokens"] = 1
    out["max_completion_tokens"] = 1
    out["stream"] = False
    out.pop("stream_options", None)
    out.pop("min_tokens", None)
    if kv_transfer_params is not None:
        out["kv_transfer_params"] = kv_transfer_params
    return out


class PdLegError(RuntimeError):
    """A leg's reply lacks what the protocol needs (e.g. no ``kv_transfer_params``): a 502."""


def prefill_transfer_params(
    prefill_response: dict[str, Any] | None, prefill: WorkerRecord, hint: str
) -> dict[str, Any]:
    """The top-level ``kv_transfer_params`` of a serial prefill reply, or :class:`PdLegError`.

    ``hint`` says how that engine must be started to return them.
    """
    params = (prefill_response or {}).get("kv_transfer_params")
    if not isinstance(params, dict):
        raise PdLegError(f"prefill worker {prefill.worker_id} returned no kv_transfer_params ({hint})")
    return params


def remote_decode_params(**extra: Any) -> dict[str, Any]:
    """The prefill leg's ``kv_transfer_params`` in the NIXL-style handshake (vLLM's
    NixlConnector, ATOM's Mooncake): decode elsewhere, no remote blocks yet; ``extra`` adds
    the engine's own keys (where the decode worker is…)."""
    return {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        **extra,
    }


def leg_headers(ctx: PdContext, rank: int | None = None) -> dict[str, str]:
    """A leg's headers: the request id, and the DP rank when one was picked."""
    headers = {"X-Request-Id": ctx.request_id}
    if rank is not None:
        headers[DP_RANK_HEADER] = str(rank)
    return headers


def peer_host(record: WorkerRecord, param: str | None = None) -> str:
    """The host a peer reaches ``record`` on: its PD param ``param`` when set, else its URL's."""
    params = record.pd.params if record.pd else {}
    value = params.get(param) if param else None
    return str(value or urlsplit(record.url).hostname or "127.0.0.1")


class KvTransferParamsLegs:
    """The legs of the transports whose KV handshake rides in ``kv_transfer_params`` (vLLM's
    connectors, ATOM's): the prefill leg is the client's body for one token
    (:func:`one_token_prefill_body`), the decode leg the client's body; each with the params
    the subclass makes (:meth:`prefill_params`, :meth:`decode_params`). ``prepare`` checks the
    route against ``routes``; :meth:`leg` makes the request (override it to steer DP ranks)."""

    name = ""
    order = PdOrder.SERIAL
    routes: tuple[str, ...] = ("/v1/completions", "/v1/chat/completions")

    def prepare(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> None:
        if ctx.route not in self.routes:
            raise PdUnsupported(f"{self.name} PD serves {' and '.join(self.routes)}, not {ctx.route}")

    def prefill_request(
        self, body: dict[str, Any], ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord
    ) -> LegRequest:
        params = self.prefill_params(ctx, prefill, decode)
        return self.leg(one_token_prefill_body(body, params), ctx, ctx.prefill_dp_rank)

    def decode_request(
        self,
        body: dict[str, Any],
        ctx: PdContext,
        prefill: WorkerRecord,
        decode: WorkerRecord,
        prefill_response: dict[str, Any] | None,
    ) -> LegRequest:
        out = dict(body)
        out["kv_transfer_params"] = self.decode_params(ctx, prefill, decode, prefill_response)
        return self.leg(out, ctx, ctx.decode_dp_rank)

    def leg(self, body: dict[str, Any], ctx: PdContext, rank: int | None) -> LegRequest:
        """One leg's request (``body`` is already this leg's own copy)."""
        return LegRequest(body=body, headers=leg_headers(ctx))

    def prefill_params(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> dict[str, Any]:
        raise NotImplementedError

    def decode_params(
        self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord, response: dict[str, Any] | None
    ) -> dict[str, Any]:
        raise NotImplementedError


class PdProtocolRegistry(Registry[PdProtocol]):
    kind = "PD protocol"
    protocol = PdProtocol


PdTransportRegistry = PdProtocolRegistry
"""The old name of :class:`PdProtocolRegistry`, kept for one release."""

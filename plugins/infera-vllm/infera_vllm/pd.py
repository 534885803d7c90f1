"""vLLM PD transports: ``vllm-nixl`` (serial pull), ``vllm-mooncake`` (concurrent push),
``vllm-moriio`` (MoRIIO WRITE mode, concurrent) and ``vllm-moriio-read`` (MoRIIO READ mode, serial).

Body shaping follows ``reference/WIRE_FORMATS.md``; the client's body is copied, never changed.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from infera_core.engine_support import bracket_host
from infera_core.pd import (
    LegRequest,
    PdContext,
    PdLegError,
    PdOrder,
    PdUnsupported,
    one_token_prefill_body,
    prefill_transfer_params,
)
from infera_core.worker import WorkerRecord

ROUTES = ("/v1/completions", "/v1/chat/completions")
MOONCAKE_DEFAULT_BOOTSTRAP_PORT = 8998


def _check_route(ctx: PdContext, protocol: str) -> None:
    if ctx.route not in ROUTES:
        raise PdUnsupported(f"{protocol} PD serves {' and '.join(ROUTES)}, not {ctx.route}")


def _request_id_header(ctx: PdContext) -> dict[str, str]:
    return {"X-Request-Id": ctx.request_id}


def _decode_leg(body: dict[str, Any], ctx: PdContext, params: dict[str, Any]) -> LegRequest:
    """The decode leg: the client's body (copied) with ``kv_transfer_params``."""
    out = dict(body)
    out["kv_transfer_params"] = params
    return LegRequest(body=out, headers=_request_id_header(ctx))


def _prepare_transfer(ctx: PdContext, protocol: str) -> None:
    """Check the route and give the pair a router-made ``transfer_id`` (concurrent legs)."""
    _check_route(ctx, protocol)
    if ctx.transfer_id is None:
        ctx.transfer_id = f"xfer-{ctx.request_id}"


class VllmNixlTransport:
    """NixlConnector: prefill one token, then decode with the prefill's ``kv_transfer_params``."""

    name = "vllm-nixl"
    order = PdOrder.SERIAL

    def prepare(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> None:
        _check_route(ctx, self.name)

    def prefill_request(
        self, body: dict[str, Any], ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord
    ) -> LegRequest:
        params = {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        }
        return LegRequest(body=one_token_prefill_body(body, params), headers=_request_id_header(ctx))

    def decode_request(
        self,
        body: dict[str, Any],
        ctx: PdContext,
        prefill: WorkerRecord,
        decode: WorkerRecord,
        prefill_response: dict[str, Any] | None,
    ) -> LegRequest:
        params = prefill_transfer_params(
            prefill_response, prefill, "is it running with --kv-transfer-config NixlConnector?"
        )
        return _decode_leg(body, ctx, params)


class VllmMooncakeTransport:
    """MooncakeConnector: both legs at once, matched by a router-made ``transfer_id``."""

    name = "vllm-mooncake"
    order = PdOrder.CONCURRENT

    def prepare(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> None:
        _prepare_transfer(ctx, self.name)

    def prefill_request(
        self, body: dict[str, Any], ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord
    ) -> LegRequest:
        params = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": _transfer_id(ctx)}
        return LegRequest(body=one_token_prefill_body(body, params), headers=_request_id_header(ctx))

    def decode_request(
        self,
        body: dict[str, Any],
        ctx: PdContext,
        prefill: WorkerRecord,
        decode: WorkerRecord,
        prefill_response: dict[str, Any] | None,
    ) -> LegRequest:
        pd_params = prefill.pd.params if prefill.pd else {}
        host = pd_params.get("bootstrap_host") or urlsplit(prefill.url).hostname or "127.0.0.1"
        port = pd_params.get("bootstrap_port") or MOONCAKE_DEFAULT_BOOTSTRAP_PORT
        # The router may have asked the prefill's bootstrap server (GET /query) for the
        # engine id of the DP rank it picked; otherwise the id the launcher configured.
        engine_id = ctx.extra.get("remote_engine_id") or pd_params.get("engine_id") or prefill.worker_id
        return _decode_leg(
            body,
            ctx,
            {
                "do_remote_decode": False,
                "do_remote_prefill": True,
                "remote_engine_id": engine_id,
                "remote_bootstrap_addr": f"http://{bracket_host(str(host))}:{port}",
                "transfer_id": _transfer_id(ctx),
            },
        )


def _transfer_id(ctx: PdContext, protocol: str = "vllm-mooncake") -> str:
    if ctx.transfer_id is None:
        raise PdLegError(f"{protocol}: prepare() must run before the legs are built (no transfer_id)")
    return ctx.transfer_id


def _moriio_peer(record: WorkerRecord) -> dict[str, Any]:
    """A MoRIIO worker's address fields, as its peer's ``kv_transfer_params`` name them."""
    params = record.pd.params if record.pd else {}
    host = params.get("host") or urlsplit(record.url).hostname or "127.0.0.1"
    return {
        "remote_engine_id": params.get("engine_id"),
        "remote_block_ids": None,
        "remote_host": host,
        "remote_port": params.get("handshake_port"),
        "remote_handshake_port": params.get("handshake_port"),
        "remote_notify_port": params.get("notify_port"),
        "remote_dp_size": params.get("dp_size", 1),
        "remote_tp_size": params.get("tp_size", 1),
        "remote_dp_rank": params.get("dp_rank", 0),
    }


class VllmMoriioTransport:
    """MoRIIOConnector, WRITE mode: both legs at once; each names its peer's MoRI-IO address
    (host, handshake and notify ports) and the router-made ``transfer_id``. The decode tells
    the prefill where to write; the prefill writes the KV and notifies the decode."""

    name = "vllm-moriio"
    order = PdOrder.CONCURRENT

    def prepare(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> None:
        _prepare_transfer(ctx, self.name)

    def prefill_request(
        self, body: dict[str, Any], ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord
    ) -> LegRequest:
        params = {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "transfer_id": _transfer_id(ctx, self.name),
            **_moriio_peer(decode),
        }
        return LegRequest(body=one_token_prefill_body(body, params), headers=_request_id_header(ctx))

    def decode_request(
        self,
        body: dict[str, Any],
        ctx: PdContext,
        prefill: WorkerRecord,
        decode: WorkerRecord,
        prefill_response: dict[str, Any] | None,
    ) -> LegRequest:
        return _decode_leg(
            body,
            ctx,
            {
                "do_remote_decode": False,
                "do_remote_prefill": True,
                "transfer_id": _transfer_id(ctx, self.name),
                **_moriio_peer(prefill),
            },
        )


class VllmMoriioReadTransport(VllmMoriioTransport):
    """MoRIIOConnector, READ mode (``read_mode: true``): prefill first, then the decode reads
    the blocks the prefill's ``kv_transfer_params`` name (verbatim, plus its DP rank)."""

    name = "vllm-moriio-read"
    order = PdOrder.SERIAL

    def decode_request(
        self,
        body: dict[str, Any],
        ctx: PdContext,
        prefill: WorkerRecord,
        decode: WorkerRecord,
        prefill_response: dict[str, Any] | None,
    ) -> LegRequest:
        params = dict(
            prefill_transfer_params(
                prefill_response, prefill, "is it running with MoRIIOConnector and read_mode true?"
            )
        )
        params.setdefault("remote_dp_rank", _moriio_peer(prefill)["remote_dp_rank"])
        return _decode_leg(body, ctx, params)

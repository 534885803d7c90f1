"""vLLM PD transports: ``vllm-nixl`` (serial pull) and ``vllm-mooncake`` (concurrent push).

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
        out = dict(body)
        out["kv_transfer_params"] = params
        return LegRequest(body=out, headers=_request_id_header(ctx))


class VllmMooncakeTransport:
    """MooncakeConnector: both legs at once, matched by a router-made ``transfer_id``."""

    name = "vllm-mooncake"
    order = PdOrder.CONCURRENT

    def prepare(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> None:
        _check_route(ctx, self.name)
        if ctx.transfer_id is None:
            ctx.transfer_id = f"xfer-{ctx.request_id}"

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
        out = dict(body)
        out["kv_transfer_params"] = {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "remote_engine_id": engine_id,
            "remote_bootstrap_addr": f"http://{bracket_host(str(host))}:{port}",
            "transfer_id": _transfer_id(ctx),
        }
        return LegRequest(body=out, headers=_request_id_header(ctx))


def _transfer_id(ctx: PdContext) -> str:
    if ctx.transfer_id is None:
        raise PdLegError("vllm-mooncake: prepare() must run before the legs are built (no transfer_id)")
    return ctx.transfer_id

"""ATOM PD transport ``atom-mooncake``: serial, ``/v1/completions`` only.

The prefill leg computes one token and names the decode worker's handshake host/port; the
decode leg carries the prefill's reply ``kv_transfer_params`` verbatim plus the prefill's
address and DP/TP sizes (``remote_dp_size`` is the prefill record's ``dp_size``, ATOM's
``-dp``: the decode offsets the prefill's side-channel port by it). ``max_tokens`` is not
decremented (ATOM's decode re-emits the prefill's first token).

A DP rank the router picked goes in the body as ``data_parallel_rank``: ATOM's OpenAI server
reads it there (``CompletionRequest.data_parallel_rank``, ``atom/entrypoints/openai/protocol.py``;
``EngineCoreManager._dispatch_to_dp_ranks`` honours it), not from a header; the
``X-Data-Parallel-Rank`` header goes along for proxies that read it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from infera_core.engines.pd import (
    KvTransferParamsLegs,
    LegRequest,
    PdContext,
    PdOrder,
    PdUnsupported,
    leg_headers,
    peer_host,
    prefill_transfer_params,
    remote_decode_params,
)
from infera_core.worker import WorkerRecord

ROUTE = "/v1/completions"


def _remote(record: WorkerRecord) -> dict[str, Any]:
    params = record.pd.params if record.pd else {}
    return {
        "remote_handshake_port": params.get("handshake_port"),
        "remote_host": peer_host(record),
        "remote_port": urlsplit(record.url).port,
        "remote_dp_size": record.dp_size,
        "remote_tp_size": params.get("tp_size", 1),
    }


class AtomMooncakeTransport(KvTransferParamsLegs):
    name = "atom-mooncake"
    order = PdOrder.SERIAL

    def prepare(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> None:
        if ctx.route != ROUTE:
            raise PdUnsupported(
                f"ATOM PD serves only {ROUTE}; {ctx.route} cannot go through prefill/decode workers "
                "(send it to a mixed ATOM worker, or use /v1/completions)"
            )

    def prefill_params(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> dict[str, Any]:
        return remote_decode_params(**_remote(decode))

    def decode_params(
        self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord, response: dict[str, Any] | None
    ) -> dict[str, Any]:
        reply = prefill_transfer_params(
            response, prefill, "is it an ATOM server started with a mooncake --kv-transfer-config?"
        )
        params: dict[str, Any] = {"do_remote_decode": False, "do_remote_prefill": True, **_remote(prefill)}
        params.update(reply)
        params["do_remote_decode"] = False
        params["do_remote_prefill"] = True
        rank = reply.get("dp_rank", ctx.prefill_dp_rank)
        if rank is not None:
            params["remote_dp_rank"] = rank
        return params

    def leg(self, body: dict[str, Any], ctx: PdContext, rank: int | None) -> LegRequest:
        """Steered to DP ``rank`` when the router picked one: in the body, where ATOM reads it."""
        if rank is not None:
            body["data_parallel_rank"] = rank
        return LegRequest(body=body, headers=leg_headers(ctx, rank))


class AtomMoriioTransport(AtomMooncakeTransport):
    """ATOM's ``moriio`` connector: the same legs (the decode reads the blocks the prefill's
    ``kv_transfer_params`` name, over MoRI-IO); a separate protocol so that a moriio worker
    never pairs with a mooncake one."""

    name = "atom-moriio"

"""vLLM PD transports: ``vllm-nixl`` (serial pull), ``vllm-mooncake`` (concurrent push),
``vllm-moriio`` (MoRIIO WRITE mode, concurrent) and ``vllm-moriio-read`` (MoRIIO READ mode, serial).

Body shaping follows ``reference/WIRE_FORMATS.md``; the client's body is copied, never changed.
The legs are :class:`infera_core.engines.pd.KvTransferParamsLegs`: each transport gives only the
``kv_transfer_params`` of its two legs.
"""

from __future__ import annotations

from typing import Any

from infera_core.engines.pd import (
    KvTransferParamsLegs,
    PdContext,
    PdLegError,
    PdOrder,
    peer_host,
    prefill_transfer_params,
    remote_decode_params,
)
from infera_core.engines.support import bracket_host
from infera_core.worker import WorkerRecord
from infera_vllm.transfer import engine_id as dp_engine_id

MOONCAKE_DEFAULT_BOOTSTRAP_PORT = 8998


class _ConcurrentLegs(KvTransferParamsLegs):
    """Both legs at once, matched by a router-made ``transfer_id``."""

    order = PdOrder.CONCURRENT

    def prepare(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> None:
        super().prepare(ctx, prefill, decode)
        if ctx.transfer_id is None:
            ctx.transfer_id = f"xfer-{ctx.request_id}"

    def transfer_id(self, ctx: PdContext) -> str:
        if ctx.transfer_id is None:
            raise PdLegError(f"{self.name}: prepare() must run before the legs are built (no transfer_id)")
        return ctx.transfer_id


class VllmNixlTransport(KvTransferParamsLegs):
    """NixlConnector: prefill one token, then decode with the prefill's ``kv_transfer_params``."""

    name = "vllm-nixl"
    order = PdOrder.SERIAL

    def prefill_params(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> dict[str, Any]:
        return remote_decode_params(remote_host=None, remote_port=None)

    def decode_params(
        self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord, response: dict[str, Any] | None
    ) -> dict[str, Any]:
        return prefill_transfer_params(
            response, prefill, "is it running with --kv-transfer-config NixlConnector?"
        )


class VllmMooncakeTransport(_ConcurrentLegs):
    """MooncakeConnector: both legs at once, matched by a router-made ``transfer_id``."""

    name = "vllm-mooncake"

    def prefill_params(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> dict[str, Any]:
        return {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": self.transfer_id(ctx)}

    def decode_params(
        self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord, response: dict[str, Any] | None
    ) -> dict[str, Any]:
        pd_params = prefill.pd.params if prefill.pd else {}
        host = peer_host(prefill, "bootstrap_host")
        port = pd_params.get("bootstrap_port") or MOONCAKE_DEFAULT_BOOTSTRAP_PORT
        # The router may have asked the prefill's bootstrap server (GET /query) for the
        # engine id of the DP rank it picked; otherwise the id the launcher recorded (vLLM's
        # per-rank id, ``<worker>_dp<K>`` under DP), else that id derived from the record.
        engine_id = (
            ctx.extra.get("remote_engine_id")
            or pd_params.get("engine_id")
            or dp_engine_id(prefill.worker_id, prefill.dp_rank, prefill.dp_size)
        )
        return {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "remote_engine_id": engine_id,
            "remote_bootstrap_addr": f"http://{bracket_host(host)}:{port}",
            "transfer_id": self.transfer_id(ctx),
        }


def _moriio_peer(record: WorkerRecord) -> dict[str, Any]:
    """A MoRIIO worker's address fields, as its peer's ``kv_transfer_params`` name them."""
    params = record.pd.params if record.pd else {}
    return {
        "remote_engine_id": params.get("engine_id"),
        "remote_block_ids": None,
        "remote_host": peer_host(record, "host"),
        "remote_port": params.get("handshake_port"),
        "remote_handshake_port": params.get("handshake_port"),
        "remote_notify_port": params.get("notify_port"),
        "remote_dp_size": params.get("dp_size", 1),
        # each launcher is one engine (vLLM's data_parallel_size_local 1): the peer folds the
        # rank to 0 for its port arithmetic and dials this worker's own ports
        "remote_dp_size_local": params.get("dp_size_local", 1),
        "remote_tp_size": params.get("tp_size", 1),
        "remote_dp_rank": params.get("dp_rank", 0),
    }


class VllmMoriioTransport(_ConcurrentLegs):
    """MoRIIOConnector, WRITE mode: both legs at once; each names its peer's MoRI-IO address
    (host, handshake and notify ports) and the router-made ``transfer_id``. The decode tells
    the prefill where to write; the prefill writes the KV and notifies the decode."""

    name = "vllm-moriio"

    def prefill_params(self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord) -> dict[str, Any]:
        return {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "transfer_id": self.transfer_id(ctx),
            **_moriio_peer(decode),
        }

    def decode_params(
        self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord, response: dict[str, Any] | None
    ) -> dict[str, Any]:
        return {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "transfer_id": self.transfer_id(ctx),
            **_moriio_peer(prefill),
        }


class VllmMoriioReadTransport(VllmMoriioTransport):
    """MoRIIOConnector, READ mode (``read_mode: true``): prefill first, then the decode reads
    the blocks the prefill's ``kv_transfer_params`` name (verbatim, plus its DP rank)."""

    name = "vllm-moriio-read"
    order = PdOrder.SERIAL

    def decode_params(
        self, ctx: PdContext, prefill: WorkerRecord, decode: WorkerRecord, response: dict[str, Any] | None
    ) -> dict[str, Any]:
        params = dict(
            prefill_transfer_params(
                response, prefill, "is it running with MoRIIOConnector and read_mode true?"
            )
        )
        params.setdefault("remote_dp_rank", _moriio_peer(prefill)["remote_dp_rank"])
        return params

"""Router side of vLLM's MoRIIOConnector: the two legs' ``kv_transfer_params``.

Field names follow vLLM's ``moriio_common.MoRIIOConnectorMetadata.add_new_req`` /
``MoRIIOConnectorScheduler`` (``transfer_id``, ``remote_engine_id``, ``remote_block_ids``,
``remote_host``, ``remote_handshake_port``, ``remote_notify_port``, ``remote_dp_rank``,
``remote_dp_size``) and the records the vLLM adapter publishes for a MoRIIO worker.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from infera_vllm.pd import VllmMoriioReadTransport, VllmMoriioTransport
from vllm_records import adapter_record

from infera_core.engines.base import LaunchContext
from infera_core.engines.pd import PdContext, PdLegError, PdOrder
from infera_core.testing.fixtures import make_hooks
from infera_core.worker import Role, WorkerRecord

BODY = {"model": "m", "prompt": "hello", "max_tokens": 32, "min_tokens": 4, "stream": True, "temperature": 0}


def record(worker_id: str, role: Role, host: str, first_port: int, **options: Any) -> WorkerRecord:
    """The worker record the vLLM adapter publishes for a MoRIIO launch."""
    ports = iter(range(first_port, first_port + 100))
    ctx = LaunchContext(
        worker_id=worker_id,
        model="m",
        model_path="/m",
        role=role,
        host="0.0.0.0",
        port=8000,
        advertise_host=host,
        options={"tp": 1, "pd_connector": "moriio", **options},
        free_port=lambda: next(ports),
    )
    return adapter_record(ctx)


def test_moriio_transports_are_registered() -> None:
    names = set(make_hooks().catalog().pd_transports.names())
    assert {"vllm-moriio", "vllm-moriio-read"} <= names


def test_write_mode_sends_both_legs_at_once_naming_each_others_address() -> None:
    p = record("p", Role.PREFILL, "10.0.0.1", 41000)
    d = record("d", Role.DECODE, "10.0.0.2", 42000, tp=2, dp_size=2, dp_rank=1)
    assert p.pd is not None and p.pd.protocol == "vllm-moriio"
    assert d.pd is not None and d.pd.protocol == "vllm-moriio"
    t = VllmMoriioTransport()
    assert t.order is PdOrder.CONCURRENT
    ctx = PdContext(request_id="req-9", route="/v1/completions")
    body = copy.deepcopy(BODY)
    t.prepare(ctx, p, d)
    pre = t.prefill_request(body, ctx, p, d)
    dec = t.decode_request(body, ctx, p, d, None)
    assert body == BODY  # the client's body is never changed
    pp, dp = p.pd.params, d.pd.params
    assert pre.body["max_tokens"] == 1 and pre.body["stream"] is False and "min_tokens" not in pre.body
    assert pre.body["kv_transfer_params"] == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "transfer_id": "xfer-req-9",
        "remote_engine_id": f"10.0.0.2:{dp['handshake_port']}",
        "remote_block_ids": None,
        "remote_host": "10.0.0.2",
        "remote_port": dp["handshake_port"],
        "remote_handshake_port": dp["handshake_port"],
        "remote_notify_port": dp["notify_port"],
        "remote_dp_size": 2,
        "remote_dp_size_local": 1,
        "remote_tp_size": 2,
        "remote_dp_rank": 1,
    }
    assert dec.body["max_tokens"] == 32 and dec.body["stream"] is True and dec.body["min_tokens"] == 4
    assert dec.body["kv_transfer_params"] == {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "transfer_id": "xfer-req-9",
        "remote_engine_id": f"10.0.0.1:{pp['handshake_port']}",
        "remote_block_ids": None,
        "remote_host": "10.0.0.1",
        "remote_port": pp["handshake_port"],
        "remote_handshake_port": pp["handshake_port"],
        "remote_notify_port": pp["notify_port"],
        "remote_dp_size": 1,
        "remote_dp_size_local": 1,
        "remote_tp_size": 1,
        "remote_dp_rank": 0,
    }
    assert pre.headers == dec.headers == {"X-Request-Id": "req-9"}


def test_read_mode_is_serial_and_forwards_the_prefills_params() -> None:
    read = '{"kv_connector":"MoRIIOConnector","kv_connector_extra_config":{"read_mode":"true"}}'
    p = record("p", Role.PREFILL, "10.0.0.1", 41000, kv_transfer_config=read, dp_size=2, dp_rank=1)
    d = record("d", Role.DECODE, "10.0.0.2", 42000, kv_transfer_config=read)
    assert p.pd is not None and p.pd.protocol == "vllm-moriio-read"
    t = VllmMoriioReadTransport()
    assert t.order is PdOrder.SERIAL
    ctx = PdContext(request_id="req-3", route="/v1/chat/completions")
    t.prepare(ctx, p, d)
    pre = t.prefill_request(BODY, ctx, p, d)
    assert pre.body["kv_transfer_params"]["transfer_id"] == "xfer-req-3"
    # what MoRIIOConnectorScheduler.request_finished returns on the prefill
    returned = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [3, 4],
        "remote_engine_id": "10.0.0.1:40999",
        "remote_host": "10.0.0.1",
        "remote_handshake_port": 40999,
        "remote_notify_port": 41003,
        "remote_dp_size": 2,
        "tp_size": 1,
        "transfer_id": "xfer-req-3",
    }
    dec = t.decode_request(BODY, ctx, p, d, {"kv_transfer_params": returned})
    assert dec.body["kv_transfer_params"] == {**returned, "remote_dp_rank": 1}
    with pytest.raises(PdLegError, match="read_mode true"):
        t.decode_request(BODY, ctx, p, d, {"choices": []})

"""PD body shaping for every protocol, per reference/WIRE_FORMATS.md (golden bodies)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from infera_atom.pd import AtomMooncakeTransport
from infera_sglang.pd import ROOM_LIMIT, SglangBootstrapTransport, steer_room
from infera_vllm.pd import VllmMooncakeTransport, VllmNixlTransport

from infera_core.engines.pd import LegRequest, PdContext, PdLegError, PdOrder, PdProtocol, PdUnsupported
from infera_core.testing.fixtures import make_hooks
from infera_core.worker import PdInfo, Role, WorkerRecord

CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 64,
    "min_tokens": 8,
    "stream": True,
    "stream_options": {"include_usage": True},
    "temperature": 0,
    "some_unknown_field": {"kept": True},
}


def worker(wid: str, role: Role, protocol: str, url: str, dp_size: int = 1, **params: Any) -> WorkerRecord:
    return WorkerRecord(
        worker_id=wid,
        url=url,
        model="m",
        engine=protocol.split("-")[0],
        role=role,
        dp_size=dp_size,
        pd=PdInfo(protocol=protocol, params=params),
    )


def prefill_body(body: dict[str, Any], **kv_transfer_params: Any) -> dict[str, Any]:
    """What a prefill leg sends: the client's body without ``min_tokens``/``stream_options``,
    one token, no stream, and the transport's ``kv_transfer_params``."""
    kept = {k: v for k, v in body.items() if k not in ("min_tokens", "stream_options")}
    one_token = {"max_tokens": 1, "max_completion_tokens": 1, "stream": False}
    return kept | one_token | {"kv_transfer_params": kv_transfer_params}


DECODE_ELSEWHERE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
}
"""A NIXL-style prefill leg's ``kv_transfer_params`` (vLLM NixlConnector, ATOM Mooncake): decode
elsewhere, no remote blocks yet; each protocol adds where the decode worker is."""


def prefill_leg(
    t: PdProtocol, order: PdOrder, body: dict[str, Any], ctx: PdContext, p: WorkerRecord, d: WorkerRecord
) -> LegRequest:
    """The protocol runs its legs in ``order``; ``ctx`` prepared, the prefill leg of ``body``."""
    assert t.order is order
    t.prepare(ctx, p, d)
    return t.prefill_request(body, ctx, p, d)


def test_all_transports_are_registered_by_the_installed_plugins() -> None:
    names = make_hooks().catalog().pd_transports.names()
    assert {"vllm-nixl", "vllm-mooncake", "sglang-bootstrap", "atom-mooncake"} <= set(names)


def test_vllm_nixl_serial_legs() -> None:
    t = VllmNixlTransport()
    p = worker("p", Role.PREFILL, "vllm-nixl", "http://10.0.0.1:8000", engine_id="p")
    d = worker("d", Role.DECODE, "vllm-nixl", "http://10.0.0.2:8000", engine_id="d")
    body = copy.deepcopy(CHAT)
    ctx = PdContext(request_id="req-1", route="/v1/chat/completions")
    pre = prefill_leg(t, PdOrder.SERIAL, body, ctx, p, d)
    assert pre.body == prefill_body(CHAT, **DECODE_ELSEWHERE, remote_host=None, remote_port=None)
    assert pre.headers == {"X-Request-Id": "req-1"}
    reply_params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "p",
        "remote_block_ids": [1, 2, 3],
        "remote_request_id": "req-1",
        "remote_host": "10.0.0.1",
        "remote_port": 5600,
        "tp_size": 1,
    }
    dec = t.decode_request(body, ctx, p, d, {"id": "x", "kv_transfer_params": reply_params})
    assert dec.body == CHAT | {"kv_transfer_params": reply_params}  # min_tokens, stream restored
    assert dec.headers == {"X-Request-Id": "req-1"}
    assert body == CHAT, "the client's body must not change"


def test_vllm_nixl_without_kv_transfer_params_is_a_leg_error() -> None:
    t = VllmNixlTransport()
    p = worker("p", Role.PREFILL, "vllm-nixl", "http://h:1")
    with pytest.raises(PdLegError, match="no kv_transfer_params"):
        t.decode_request(CHAT, PdContext("r", "/v1/completions"), p, p, {"choices": []})


def test_vllm_mooncake_concurrent_legs_share_the_transfer_id() -> None:
    t = VllmMooncakeTransport()
    p = worker("p", Role.PREFILL, "vllm-mooncake", "http://10.0.0.1:8000", engine_id="p", bootstrap_port=9001)
    d = worker("d", Role.DECODE, "vllm-mooncake", "http://10.0.0.2:8000", engine_id="d")
    body = {"model": "m", "prompt": "hello", "max_tokens": 5, "stream": True}
    ctx = PdContext(request_id="abc", route="/v1/completions")
    pre = prefill_leg(t, PdOrder.CONCURRENT, body, ctx, p, d)
    assert ctx.transfer_id == "xfer-abc"
    assert pre.body == prefill_body(
        body, do_remote_decode=True, do_remote_prefill=False, transfer_id="xfer-abc"
    )
    dec = t.decode_request(body, ctx, p, d, None)
    assert dec.body == body | {
        "kv_transfer_params": {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "remote_engine_id": "p",
            "remote_bootstrap_addr": "http://10.0.0.1:9001",
            "transfer_id": "xfer-abc",
        }
    }
    assert pre.headers == dec.headers == {"X-Request-Id": "abc"}


def test_vllm_mooncake_engine_id_from_the_bootstrap_query_and_ipv6_host() -> None:
    t = VllmMooncakeTransport()
    p = worker("p", Role.PREFILL, "vllm-mooncake", "http://[fd00::1]:8000", engine_id="p")
    ctx = PdContext(request_id="r", route="/v1/completions", transfer_id="xfer-router")
    ctx.extra["remote_engine_id"] = "p_dp1"
    t.prepare(ctx, p, p)
    params = t.decode_request({"prompt": "x"}, ctx, p, p, None).body["kv_transfer_params"]
    assert params["remote_engine_id"] == "p_dp1"
    assert params["remote_bootstrap_addr"] == "http://[fd00::1]:8998"  # vLLM's default bootstrap port
    assert params["transfer_id"] == "xfer-router"


def test_sglang_bootstrap_legs_carry_the_same_room() -> None:
    t = SglangBootstrapTransport()
    p = worker("p", Role.PREFILL, "sglang-bootstrap", "http://[fd00::7]:30000", bootstrap_port=8999)
    d = worker("d", Role.DECODE, "sglang-bootstrap", "http://10.0.0.2:30000")
    body = copy.deepcopy(CHAT)
    ctx = PdContext(request_id="r9", route="/v1/chat/completions")
    pre = prefill_leg(t, PdOrder.CONCURRENT, body, ctx, p, d)
    assert ctx.bootstrap_room is not None and 0 <= ctx.bootstrap_room < ROOM_LIMIT
    extra = {"bootstrap_host": "[fd00::7]", "bootstrap_port": 8999, "bootstrap_room": ctx.bootstrap_room}
    dec = t.decode_request(body, ctx, p, d, None)
    assert pre.body == dec.body == CHAT | extra
    assert "X-Data-Parallel-Rank" not in pre.headers
    assert body == CHAT


def test_sglang_room_steers_a_dp_attention_prefill() -> None:
    t = SglangBootstrapTransport()
    p = worker("p", Role.PREFILL, "sglang-bootstrap", "http://10.0.0.1:30000", dp_size=8)
    d = worker("d", Role.DECODE, "sglang-bootstrap", "http://10.0.0.2:30000", dp_size=4)
    for rank in range(8):
        ctx = PdContext(
            request_id="r", route="/v1/completions", prefill_dp_rank=rank, decode_dp_rank=rank % 4
        )
        t.prepare(ctx, p, d)
        assert ctx.bootstrap_room is not None and ctx.bootstrap_room % 8 == rank
        assert t.prefill_request({}, ctx, p, d).headers["X-Data-Parallel-Rank"] == str(rank)
        assert t.decode_request({}, ctx, p, d, None).headers["X-Data-Parallel-Rank"] == str(rank % 4)
    # the room stays inside 0…2^63-1 even at the top of the range
    top = steer_room(ROOM_LIMIT - 1, 8, 0)
    assert top < ROOM_LIMIT and top % 8 == 0
    with pytest.raises(PdUnsupported):
        steer_room(5, 4, 4)


def test_atom_mooncake_serial_on_completions() -> None:
    t = AtomMooncakeTransport()
    p = worker("p", Role.PREFILL, "atom-mooncake", "http://10.0.0.1:8888", handshake_port=6301, tp_size=8)
    d = worker(
        "d", Role.DECODE, "atom-mooncake", "http://10.0.0.2:8889", dp_size=2, handshake_port=6401, tp_size=4
    )
    body = {"model": "m", "prompt": "1 2 3", "max_tokens": 10, "stream": True}
    ctx = PdContext(request_id="q", route="/v1/completions")
    pre = prefill_leg(t, PdOrder.SERIAL, body, ctx, p, d)
    assert pre.body == prefill_body(
        body,
        **DECODE_ELSEWHERE,
        remote_handshake_port=6401,
        remote_host="10.0.0.2",
        remote_port=8889,
        remote_dp_size=2,
        remote_tp_size=4,
    )
    reply = {"transfer_id": "t-1", "remote_engine_id": "e", "remote_block_ids": [4, 5], "dp_rank": 0}
    dec = t.decode_request(body, ctx, p, d, {"kv_transfer_params": reply})
    assert dec.body["max_tokens"] == 10, "ATOM's max_tokens is not decremented"
    assert dec.body["stream"] is True
    assert dec.body["kv_transfer_params"] == {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "remote_handshake_port": 6301,
        "remote_host": "10.0.0.1",
        "remote_port": 8888,
        "remote_dp_size": 1,
        "remote_tp_size": 8,
        **reply,
        "remote_dp_rank": 0,
    }
    assert pre.headers["X-Request-Id"] == dec.headers["X-Request-Id"] == "q"


def test_atom_chat_pd_is_unsupported_with_a_clear_message() -> None:
    t = AtomMooncakeTransport()
    p = worker("p", Role.PREFILL, "atom-mooncake", "http://h:1")
    with pytest.raises(PdUnsupported, match=r"only /v1/completions.*/v1/chat/completions"):
        t.prepare(PdContext(request_id="r", route="/v1/chat/completions"), p, p)

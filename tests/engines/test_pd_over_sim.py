"""The PD transports' bodies, sent over real HTTP to infera-sim prefill/decode processes
(which implement vllm-nixl and sglang-bootstrap per WIRE_FORMATS.md): the decode answers."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from infera_sglang.pd import SglangBootstrapTransport
from infera_sim.testing import start_sim
from infera_vllm.pd import VllmMoriioReadTransport, VllmMoriioTransport, VllmNixlTransport

from infera_core.engines.pd import PdContext, PdOrder, PdProtocol
from infera_core.worker import PdInfo, Role, WorkerRecord

pytestmark = pytest.mark.slow

BODY = {"model": "sim-model", "prompt": "one two three four five six seven eight " * 8, "max_tokens": 6}


def record(wid: str, url: str, role: Role, protocol: str, **params: Any) -> WorkerRecord:
    return WorkerRecord(
        worker_id=wid,
        url=url,
        model="sim-model",
        engine="sim",
        role=role,
        pd=PdInfo(protocol=protocol, params=params),
    )


def serial_flow(t: PdProtocol, p: WorkerRecord, d: WorkerRecord, request_id: str) -> dict[str, Any]:
    """The prefill leg, then the decode leg with its answer, both to the sims; the prefill
    leg's answer is returned."""
    ctx = PdContext(request_id=request_id, route="/v1/completions")
    assert t.order is PdOrder.SERIAL
    t.prepare(ctx, p, d)
    pre = t.prefill_request(BODY, ctx, p, d)
    first = httpx.post(p.url + ctx.route, json=pre.body, headers=pre.headers, timeout=30)
    assert first.status_code == 200, first.text
    dec = t.decode_request(BODY, ctx, p, d, first.json())
    final = httpx.post(d.url + ctx.route, json=dec.body, headers=dec.headers, timeout=30)
    assert final.status_code == 200, final.text
    assert final.json()["usage"]["completion_tokens"] == BODY["max_tokens"]
    answer: dict[str, Any] = first.json()
    return answer


def concurrent_flow(t: PdProtocol, p: WorkerRecord, d: WorkerRecord, request_id: str) -> None:
    """Both legs at once, the decode leg sent first: it waits for the KV the prefill leg makes."""
    ctx = PdContext(request_id=request_id, route="/v1/completions")
    assert t.order is PdOrder.CONCURRENT
    t.prepare(ctx, p, d)
    pre = t.prefill_request(BODY, ctx, p, d)
    dec = t.decode_request(BODY, ctx, p, d, None)

    async def both() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(
                client.post(d.url + ctx.route, json=dec.body, headers=dec.headers),
                client.post(p.url + ctx.route, json=pre.body, headers=pre.headers),
            )

    final, first = asyncio.run(both())
    assert first.status_code == 200, first.text
    assert final.status_code == 200, final.text
    assert final.json()["usage"]["completion_tokens"] == BODY["max_tokens"]


def test_vllm_nixl_serial_flow_against_sims() -> None:
    with (
        start_sim(role="prefill", pd_protocol="vllm-nixl", speedup=50) as p_sim,
        start_sim(role="decode", pd_protocol="vllm-nixl", speedup=50) as d_sim,
    ):
        p = record("p", p_sim.url, Role.PREFILL, "vllm-nixl")
        d = record("d", d_sim.url, Role.DECODE, "vllm-nixl")
        first = serial_flow(VllmNixlTransport(), p, d, "req-nixl-1")
        assert first["usage"]["completion_tokens"] == 1


def test_sglang_bootstrap_concurrent_flow_against_sims() -> None:
    with (
        start_sim(role="prefill", pd_protocol="sglang-bootstrap", bootstrap_port=0, speedup=50) as p_sim,
        start_sim(role="decode", pd_protocol="sglang-bootstrap", speedup=50) as d_sim,
    ):
        assert p_sim.bootstrap_port is not None
        p = record(
            "p",
            p_sim.url,
            Role.PREFILL,
            "sglang-bootstrap",
            bootstrap_host="127.0.0.1",
            bootstrap_port=p_sim.bootstrap_port,
        )
        d = record("d", d_sim.url, Role.DECODE, "sglang-bootstrap")
        concurrent_flow(SglangBootstrapTransport(), p, d, "req-sgl-1")


def moriio_record(wid: str, url: str, role: Role, protocol: str, port: int | None) -> WorkerRecord:
    """A MoRIIO worker's record as the vLLM adapter publishes it (host, handshake/notify ports)."""
    return record(
        wid,
        url,
        role,
        protocol,
        host="127.0.0.1",
        handshake_port=port,
        notify_port=port,
        engine_id=f"127.0.0.1:{port}",
    )


def test_vllm_moriio_write_mode_concurrent_flow_against_sims() -> None:
    """Both legs at once, the decode first: it finds the prefill by the address in its
    kv_transfer_params and waits for the transfer the router named."""
    with (
        start_sim(role="prefill", pd_protocol="vllm-moriio", speedup=50) as p_sim,
        start_sim(role="decode", pd_protocol="vllm-moriio", speedup=50) as d_sim,
    ):
        p = moriio_record("p", p_sim.url, Role.PREFILL, "vllm-moriio", p_sim.bootstrap_port)
        d = moriio_record("d", d_sim.url, Role.DECODE, "vllm-moriio", d_sim.bootstrap_port)
        concurrent_flow(VllmMoriioTransport(), p, d, "req-mori-1")


def test_vllm_moriio_read_mode_serial_flow_against_sims() -> None:
    with (
        start_sim(role="prefill", pd_protocol="vllm-moriio-read", speedup=50) as p_sim,
        start_sim(role="decode", pd_protocol="vllm-moriio-read", speedup=50) as d_sim,
    ):
        p = moriio_record("p", p_sim.url, Role.PREFILL, "vllm-moriio-read", p_sim.bootstrap_port)
        d = moriio_record("d", d_sim.url, Role.DECODE, "vllm-moriio-read", d_sim.bootstrap_port)
        first = serial_flow(VllmMoriioReadTransport(), p, d, "req-mori-2")
        assert first["kv_transfer_params"]["transfer_id"] == "xfer-req-mori-2"

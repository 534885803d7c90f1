"""PD disaggregation between two sim processes, legs built by the real PD transports.

* ``vllm-nixl`` (serial): prefill returns ``kv_transfer_params``; decode pulls the KV,
  reports it as cached, and announces the received blocks as ``BlockStored``.
* ``sglang-bootstrap`` (concurrent): the decode leg, sent first, waits for the prefill's KV.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from infera_sim.testing import KvMirror, SimHandle, start_sim

from infera_core.engines.pd import PdContext
from infera_core.worker import PdInfo, Role, WorkerRecord

PROMPT = " ".join(f"tok{i % 53}" for i in range(200))


def _record(sim: SimHandle, role: Role, protocol: str) -> WorkerRecord:
    params: dict[str, Any] = {"engine_id": sim.info["engine_id"]}
    if sim.bootstrap_port is not None:
        params.update(bootstrap_host="127.0.0.1", bootstrap_port=sim.bootstrap_port)
    return WorkerRecord(
        worker_id=f"{role}-{sim.port}",
        url=sim.url,
        model="pd-model",
        engine="sim",
        role=role,
        pd=PdInfo(protocol=protocol, params=params),
    )


@pytest.fixture(scope="module")
def nixl_pair() -> Iterator[tuple[SimHandle, SimHandle]]:
    common: dict[str, Any] = {"model": "pd-model", "speedup": "inf", "pd_protocol": "vllm-nixl"}
    with start_sim(role="prefill", **common) as prefill, start_sim(role="decode", **common) as decode:
        yield prefill, decode


def test_vllm_nixl_serial_transfer(nixl_pair: tuple[SimHandle, SimHandle]) -> None:
    transport_mod = pytest.importorskip("infera_vllm.pd")
    transport = transport_mod.VllmNixlTransport()
    prefill, decode = nixl_pair
    p_rec, d_rec = _record(prefill, Role.PREFILL, "vllm-nixl"), _record(decode, Role.DECODE, "vllm-nixl")
    assert decode.kv_events_endpoint is not None
    mirror = KvMirror(decode.kv_events_endpoint, decode.replay_endpoint)
    body = {"model": "pd-model", "prompt": PROMPT, "max_tokens": 6, "stream": True}
    ctx = PdContext(request_id="pd-req-1", route="/v1/completions")
    try:
        with httpx.Client(timeout=10) as client:
            leg1 = transport.prefill_request(body, ctx, p_rec, d_rec)
            r1 = client.post(prefill.url + "/v1/completions", json=leg1.body, headers=leg1.headers)
            assert r1.status_code == 200, r1.text
            first = r1.json()
            params = first["kv_transfer_params"]
            assert (
                params["do_remote_prefill"] is True
                and params["remote_engine_id"] == prefill.info["engine_id"]
            )
            assert params["remote_request_id"] == "pd-req-1" and params["remote_block_ids"]
            assert first["usage"]["completion_tokens"] == 1

            leg2 = transport.decode_request(dict(body, stream=False), ctx, p_rec, d_rec, first)
            r2 = client.post(decode.url + "/v1/completions", json=leg2.body, headers=leg2.headers)
            assert r2.status_code == 200, r2.text
            usage = r2.json()["usage"]
            assert usage["completion_tokens"] == 6
            assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1

            # the decode now holds the prompt's blocks, with the same hashes as the prefill
            p_cache = client.get(prefill.url + "/sim/cache").json()
            d_cache = client.get(decode.url + "/sim/cache").json()
            prompt_blocks = usage["prompt_tokens"] // 16
            assert len(set(p_cache["block_hashes"]) & set(d_cache["block_hashes"])) >= prompt_blocks
            mirror.sync(d_cache["next_seq"])
            assert mirror.blocks == set(d_cache["block_hashes"])

            # the KV is handed over once; a replayed or forged decode leg is refused or recomputed
            forged = dict(leg2.body, kv_transfer_params=dict(params, remote_engine_id="someone-else"))
            r3 = client.post(decode.url + "/v1/completions", json=forged)
            assert r3.status_code == 200  # already transferred: recomputed locally, like vLLM's fallback
            bad = dict(leg2.body, kv_transfer_params={"do_remote_prefill": True})
            r4 = client.post(decode.url + "/v1/completions", json=bad)
            assert r4.status_code == 400 and r4.json()["error"]["param"] == "kv_transfer_params"
    finally:
        mirror.close()


def test_vllm_nixl_decode_checks_the_engine_id(nixl_pair: tuple[SimHandle, SimHandle]) -> None:
    prefill, decode = nixl_pair
    body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 1}
    with httpx.Client(timeout=10) as client:
        first = client.post(
            prefill.url + "/v1/completions", json=dict(body, kv_transfer_params={"do_remote_decode": True})
        ).json()
        params = dict(first["kv_transfer_params"], remote_engine_id="not-the-prefill")
        resp = client.post(decode.url + "/v1/completions", json=dict(body, kv_transfer_params=params))
    assert resp.status_code == 400
    assert "remote_engine_id" in resp.json()["error"]["message"]


async def _concurrent(
    prefill: SimHandle, decode: SimHandle, stream: bool
) -> tuple[dict[str, Any], dict[str, Any], float, float]:
    transport_mod = pytest.importorskip("infera_sglang.pd")
    transport = transport_mod.SglangBootstrapTransport()
    p_rec = _record(prefill, Role.PREFILL, "sglang-bootstrap")
    d_rec = _record(decode, Role.DECODE, "sglang-bootstrap")
    ctx = PdContext(request_id=f"pd-req-{stream}", route="/v1/chat/completions")
    transport.prepare(ctx, p_rec, d_rec)
    body: dict[str, Any] = {
        "model": "pd-model",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 4,
    }
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    leg_p = transport.prefill_request(body, ctx, p_rec, d_rec)
    leg_d = transport.decode_request(body, ctx, p_rec, d_rec, None)
    async with httpx.AsyncClient(timeout=20) as client:
        await client.get(decode.url + "/health")
        start = time.perf_counter()
        decode_task = asyncio.create_task(
            client.post(decode.url + "/v1/chat/completions", json=leg_d.body, headers=leg_d.headers)
        )
        await asyncio.sleep(0.05)  # the decode leg arrives first and must wait for the KV
        prefill_resp = await client.post(prefill.url + "/v1/chat/completions", json=leg_p.body)
        prefill_done = time.perf_counter() - start
        decode_resp = await decode_task
        decode_done = time.perf_counter() - start
    assert prefill_resp.status_code == 200, prefill_resp.text
    assert decode_resp.status_code == 200, decode_resp.text
    return _final(prefill_resp), _final(decode_resp), prefill_done, decode_done


def _final(resp: httpx.Response) -> dict[str, Any]:
    """The response body, or for a stream its text and usage gathered from the chunks."""
    if not resp.headers["content-type"].startswith("text/event-stream"):
        data: dict[str, Any] = resp.json()
        return data
    text, usage = "", dict[str, Any]()
    for line in resp.text.splitlines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                text += choice["delta"].get("content") or ""
    return {"usage": usage, "choices": [{"message": {"content": text}}]}


def test_sglang_bootstrap_concurrent_transfer() -> None:
    common: dict[str, Any] = {"model": "pd-model", "pd_protocol": "sglang-bootstrap", "speedup": 1}
    with (
        start_sim(role="prefill", prefill_tokens_per_s=2000, **common) as prefill,
        start_sim(role="decode", **common) as decode,
    ):
        assert prefill.bootstrap_port is not None
        for stream in (False, True):
            first, out, prefill_done, decode_done = asyncio.run(_concurrent(prefill, decode, stream))
            usage = out["usage"]
            assert first["usage"]["completion_tokens"] == 1  # the prefill only computes the first token
            assert usage["completion_tokens"] == 4
            assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
            assert out["choices"][0]["message"]["content"]
            assert decode_done >= prefill_done * 0.9
        blocks = httpx.get(decode.url + "/sim/cache").json()["block_hashes"]
        assert len(blocks) >= usage["prompt_tokens"] // 16


def test_a_prefill_that_never_finished_is_a_404_naming_the_room_or_transfer() -> None:
    """The transfer server answers a decode asking for a prefill that never ran with 404 once
    the request's ``timeout`` passed, and a room that is not a number with 400."""
    with start_sim(role="prefill", pd_protocol="sglang-bootstrap", bootstrap_port=0, speedup=50) as sim:
        base = f"http://127.0.0.1:{sim.bootstrap_port}/sim"
        room = httpx.get(f"{base}/bootstrap/123?timeout=0.05", timeout=10)
        assert room.status_code == 404 and room.json()["error"] == "no prefill finished for room 123"
        transfer = httpx.get(f"{base}/moriio/xfer-1?timeout=0.05", timeout=10)
        assert transfer.status_code == 404
        assert transfer.json()["error"] == "no prefill finished for transfer xfer-1"
        assert httpx.get(f"{base}/bootstrap/abc", timeout=10).status_code == 400

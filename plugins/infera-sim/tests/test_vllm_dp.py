"""The sim reproduces what vLLM 0.32 does under external-LB data parallel, so a sim test
fails where the real engine would:

* a dense model (``--num-experts 0``) with ``--data-parallel-size N --dp-rank K`` dies at start
  with vLLM's "Non-MoE models do not support external data parallel mode";
* the KV connector engine id of rank K is ``<engine-id>_dpK``; a Mooncake decode leg naming
  another id is failed, as vLLM's ``MooncakeConnectorWorker`` fails it ("remote engine_id …
  not found from bootstrap server").
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import httpx
import pytest
from infera_sim.testing import SimHandle, start_sim

from infera_core.engines.base import LaunchContext
from infera_core.engines.pd import LegRequest, PdContext
from infera_core.worker import Role, WorkerRecord

PROMPT = " ".join(f"tok{i % 41}" for i in range(160))
VLLM_REFUSAL = (  # vLLM 0.32, vllm/engine/arg_utils.py
    "ValueError: Non-MoE models do not support external data parallel mode. For external load "
    "balancing, launch independent vLLM instances without --data-parallel-* arguments."
)
COMMON: dict[str, Any] = {"model": "pd-model", "pd_protocol": "vllm-mooncake", "speedup": "inf"}


def test_a_dense_model_under_external_dp_dies_at_start_like_vllm() -> None:
    argv = [sys.executable, "-m", "infera_sim.server", "--port", "0"]
    run = subprocess.run(
        [*argv, "--data-parallel-size", "2", "--dp-rank", "1", "--num-experts", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == VLLM_REFUSAL


def test_a_moe_model_under_external_dp_serves_with_the_rank_suffixed_engine_id() -> None:
    with start_sim(engine_id="w7", data_parallel_size=2, dp_rank=1, num_experts=8, speedup="inf") as sim:
        assert sim.info["kv_engine_id"] == "w7_dp1"
        r = httpx.post(
            sim.url + "/v1/completions", json={"model": "sim-model", "prompt": "hi", "max_tokens": 2}
        )
        assert r.status_code == 200, r.text
    with start_sim(engine_id="w8", speedup="inf") as single:
        assert single.info["kv_engine_id"] == "w8"


def _vllm_prefill_record(prefill: SimHandle) -> WorkerRecord:
    """The record the vLLM adapter publishes for a Mooncake prefill, rank 1 of 2, bound where the sim is."""
    adapter = pytest.importorskip("infera_vllm.adapter").VllmAdapter()
    ctx = LaunchContext(
        worker_id="p",
        model="pd-model",
        model_path="/models/m",
        role=Role.PREFILL,
        host="127.0.0.1",
        port=prefill.port,
        advertise_host="127.0.0.1",
        options={"tp": 1, "pd_connector": "mooncake"},
        free_port=iter(range(45000, 45100)).__next__,
        dp_rank=1,
        dp_size=2,
    )
    fields = adapter.record_fields(ctx)
    assert fields.pd is not None
    fields.pd.params["bootstrap_port"] = prefill.bootstrap_port  # the port the sim bound
    return WorkerRecord(
        worker_id="p",
        url=prefill.url,
        model="pd-model",
        engine="vllm",
        role=Role.PREFILL,
        dp_rank=fields.dp_rank,
        dp_size=fields.dp_size,
        pd=fields.pd,
    )


async def _both(
    prefill: SimHandle, pre: LegRequest, decode: SimHandle, dec: LegRequest
) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as client:
        return list(
            await asyncio.gather(
                client.post(decode.url + "/v1/completions", json=dec.body, headers=dec.headers),
                client.post(prefill.url + "/v1/completions", json=pre.body, headers=pre.headers),
            )
        )


def test_mooncake_pd_with_a_dp_prefill_reaches_the_ranks_engine() -> None:
    transport = pytest.importorskip("infera_vllm.pd").VllmMooncakeTransport()
    with (
        start_sim(
            role="prefill", engine_id="p", data_parallel_size=2, dp_rank=1, num_experts=8, **COMMON
        ) as pre_sim,
        start_sim(role="decode", engine_id="d", **COMMON) as dec_sim,
    ):
        prefill = _vllm_prefill_record(pre_sim)
        decode = dec_sim.record("d", role=Role.DECODE)
        body = {"model": "pd-model", "prompt": PROMPT, "max_tokens": 4}
        ctx = PdContext(request_id="mc-1", route="/v1/completions")
        transport.prepare(ctx, prefill, decode)
        pre = transport.prefill_request(body, ctx, prefill, decode)
        dec = transport.decode_request(body, ctx, prefill, decode, None)
        assert dec.body["kv_transfer_params"]["remote_engine_id"] == "p_dp1"
        to_decode, to_prefill = asyncio.run(_both(pre_sim, pre, dec_sim, dec))
        assert to_prefill.status_code == 200, to_prefill.text
        assert to_prefill.json()["kv_transfer_params"] is None  # Mooncake's prefill returns none
        assert to_decode.status_code == 200, to_decode.text
        usage = to_decode.json()["usage"]
        assert usage["completion_tokens"] == 4
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0  # the KV came from the prefill

        # what Infera sent before: the worker id, which no rank registered
        ctx2 = PdContext(request_id="mc-2", route="/v1/completions")
        transport.prepare(ctx2, prefill, decode)
        wrong = transport.decode_request(body, ctx2, prefill, decode, None)
        wrong.body["kv_transfer_params"]["remote_engine_id"] = "p"
        r = httpx.post(dec_sim.url + "/v1/completions", json=wrong.body, timeout=30)
        assert r.status_code == 500
        assert r.json()["error"]["message"].startswith("remote engine_id p not found from bootstrap server")


def test_the_sim_adapter_launches_an_external_dp_rank_as_vllm_does() -> None:
    from infera_sim.adapter import SimAdapter

    ctx = LaunchContext(
        worker_id="w3",
        model="sim-model",
        model_path=None,
        role=Role.PREFILL,
        host="127.0.0.1",
        port=8100,
        advertise_host="127.0.0.1",
        options={"pd_protocol": "vllm-mooncake"},
        free_port=iter(range(46000, 46100)).__next__,
        dp_rank=1,
        dp_size=2,
    )
    argv = SimAdapter().build_launch(ctx).argv
    assert argv[argv.index("--data-parallel-size") + 1] == "2" and argv[argv.index("--dp-rank") + 1] == "1"
    pd = SimAdapter().record_fields(ctx).pd
    assert pd is not None and pd.protocol == "vllm-mooncake" and pd.params["engine_id"] == "w3_dp1"


@pytest.mark.slow
async def test_up_serves_through_a_sim_mooncake_pair() -> None:
    """``infera-run up --prefill 1 --decode 1 --pd-protocol vllm-mooncake``: the router's vLLM
    Mooncake transport against sims that check the engine id as vLLM does."""
    pytest.importorskip("infera_vllm.pd")
    from infera_core.up.settings import UpSettings
    from infera_core.up.stack import Stack

    settings = UpSettings(
        prefill=1, decode=1, pd_protocol="vllm-mooncake", port=0, quiet=True, drain_timeout=1
    )
    async with (
        Stack(settings, engine_args=["--speedup", "20"]) as stack,
        httpx.AsyncClient(base_url=stack.root, timeout=20) as c,
    ):
        workers = {w["role"]: w for w in (await c.get("/v1/workers")).json()["data"]}
        body = {"model": "sim-model", "prompt": "hello " * 50, "max_tokens": 4}
        r = await c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.headers["x-infera-worker"] == workers["decode"]["worker_id"]
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # KV from the prefill

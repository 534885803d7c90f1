"""TensorRT-LLM disaggregated serving through Infera's router (``pd.protocol = "trtllm-disagg"``).

The legs follow ``tensorrt_llm/serve/openai_disagg_server.py``: a ``context_only`` request (one
token, not streamed) to the prefill worker, then the client's request to the decode worker with
the context reply's ``disaggregated_params`` as ``generation_only``. The two ``trtllm-serve``
processes are stand-ins (``trtllm_standin.py``) started with the argv and LLM API YAML the
adapter builds for ``--role prefill`` / ``--role decode``; the router is the real one.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from infera_openai.trtllm import TrtllmAdapter
from infera_openai.trtllm_pd import TrtllmDisaggProtocol

from infera_core.discovery.memory import MemoryStore
from infera_core.engines.base import LaunchContext
from infera_core.engines.pd import PdContext, PdLegError
from infera_core.errors import EngineError
from infera_core.plugin.hooks import InferaHooks
from infera_core.testing.contracts import launch_record, sample_launch_context
from infera_core.testing.server import serving, settings_for
from infera_core.util.net import free_port
from infera_core.worker import Role, WorkerRecord

STANDIN = Path(__file__).with_name("trtllm_standin.py")


def context(role: Role, port: int, **options: object) -> LaunchContext:
    return sample_launch_context(
        worker_id=f"trt-{role.value}",
        model="tiny",
        model_path="/models/tiny",
        role=role,
        port=port,
        options={"trtllm_serve": sys.executable, "kv_events": False, **options},
    )


def record(ctx: LaunchContext) -> WorkerRecord:
    return launch_record(TrtllmAdapter(), ctx)


def test_roles_get_the_llm_api_settings_disaggregation_needs() -> None:
    adapter = TrtllmAdapter()
    for role, overlap in ((Role.PREFILL, True), (Role.DECODE, None)):
        ctx = context(role, 30000, transfer_backend="ucx")
        argv = adapter.build_launch(ctx).argv
        written = yaml.safe_load(Path(argv[argv.index("--extra_llm_api_options") + 1]).read_text())
        assert written["cache_transceiver_config"] == {"backend": "UCX"}
        assert written.get("disable_overlap_scheduler") is overlap  # context servers run without it
        pd = adapter.record_fields(ctx).pd
        assert pd is not None and (pd.protocol, pd.params) == ("trtllm-disagg", {"backend": "UCX"})
    assert adapter.record_fields(context(Role.MIXED, 30000)).pd is None
    with pytest.raises(
        EngineError, match=r"^--transfer-backend MOONCAKE: expected one of DEFAULT, UCX, NIXL, MPI$"
    ):
        adapter.build_launch(context(Role.PREFILL, 30000, transfer_backend="mooncake"))


def test_legs_are_shaped_like_the_disaggregated_servers() -> None:
    proto = TrtllmDisaggProtocol()
    p, d = record(context(Role.PREFILL, 1)), record(context(Role.DECODE, 2))
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 9, "stream": True, "stream_options": {"x": 1}}
    ctx = PdContext("r1", "/v1/completions")
    leg = proto.prefill_request(body, ctx, p, d).body
    assert leg["disaggregated_params"] == {"request_type": "context_only"}
    assert (leg["max_tokens"], leg["stream"], "stream_options" in leg) == (1, False, False)
    reply = {"choices": [{"disaggregated_params": {"request_type": "context_only", "first_gen_tokens": [5]}}]}
    dec = proto.decode_request(body, ctx, p, d, reply).body
    assert dec["disaggregated_params"] == {"request_type": "generation_only", "first_gen_tokens": [5]}
    assert dec["max_tokens"] == 9 and dec["stream"] is True and "disaggregated_params" not in body
    with pytest.raises(PdLegError, match=r"returned no choices\[0\]\.disaggregated_params"):
        proto.decode_request(body, ctx, p, d, {"choices": [{"text": "x"}]})


@pytest.fixture
def pd_pair() -> Iterator[tuple[LaunchContext, LaunchContext]]:
    procs = []
    ctxs = []
    try:
        for role in (Role.PREFILL, Role.DECODE):
            ctx = context(role, free_port())
            argv = TrtllmAdapter().build_launch(ctx).argv
            procs.append(subprocess.Popen([sys.executable, str(STANDIN), *argv[1:]]))
            ctxs.append(ctx)
        deadline = time.monotonic() + 60
        with httpx.Client() as client:
            for ctx in ctxs:
                while True:  # until it answers /health (the stand-in starts in well under a second)
                    try:
                        if client.get(f"{ctx.url}/health", timeout=1).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    assert all(p.poll() is None for p in procs), "a stand-in trtllm-serve exited"
                    assert time.monotonic() < deadline, "a stand-in trtllm-serve did not serve"
                    time.sleep(0.05)
        yield ctxs[0], ctxs[1]
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


async def test_the_router_runs_a_request_through_a_context_and_a_generation_server(
    pd_pair: tuple[LaunchContext, LaunchContext],
) -> None:
    prefill, decode = pd_pair
    store = MemoryStore()
    async with serving(settings_for(), InferaHooks.load(), store) as srv:
        store.put(record(prefill))
        store.put(record(decode))
        await srv.wait_workers(2)
        async with httpx.AsyncClient(timeout=30) as client:
            reply = await client.post(
                f"{srv.url}/v1/completions", json={"model": "tiny", "prompt": "say A", "max_tokens": 8}
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["text"] == " A generated"
            ctx_seen = (await client.get(f"{prefill.url}/seen")).json()
            gen_seen = (await client.get(f"{decode.url}/seen")).json()
    assert [b["disaggregated_params"]["request_type"] for b in ctx_seen] == ["context_only"]
    assert ctx_seen[0]["max_tokens"] == 1 and ctx_seen[0]["stream"] is False
    assert [b["disaggregated_params"]["request_type"] for b in gen_seen] == ["generation_only"]
    assert gen_seen[0]["max_tokens"] == 8 and gen_seen[0]["disaggregated_params"]["ctx_request_id"] == 7

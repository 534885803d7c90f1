"""``infera-run worker sglang|atom`` end to end with stand-in engines that accept the real
flags and serve through infera-sim; start-up failures and missing engines as a user sees them."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from infera_sglang.pd import SglangBootstrapTransport
from standin_engines import standin_source

from infera_core.engines.pd import PdContext, check_pair
from infera_core.testing.engine_env import FakeEngineEnv, clean_environ, make_engine_env
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import LauncherProcess
from infera_core.testing.published import KvSubscriber, etcd_workers, wait_registered
from infera_core.worker import WorkerRecord

pytestmark = pytest.mark.slow


def sglang_env(root: Path) -> FakeEngineEnv:
    return make_engine_env(root, "sglang.launch_server", source=standin_source("sglang_launch_server"))


def atom_env(root: Path) -> FakeEngineEnv:
    return make_engine_env(
        root, "atom.entrypoints.openai_server", source=standin_source("atom_openai_server")
    )


def launch(engine: str, *args: str) -> LauncherProcess:
    return LauncherProcess(
        ["worker", engine, "--drain-timeout", "2", "--stop-timeout", "5", *args], clean_environ()
    )


@contextmanager
def registered(
    engine: str, env: FakeEngineEnv, etcd: EtcdServer, model: str, worker_id: str
) -> Iterator[tuple[LauncherProcess, WorkerRecord]]:
    """A launcher of ``engine`` registered in ``etcd`` as ``worker_id``; when the block ends
    without an error, SIGTERM must stop it cleanly and deregister it. It is killed at the end."""
    where = ["--engine-python", env.python, "--etcd-endpoint", etcd.endpoint]
    proc = launch(engine, "--model", model, "--worker-id", worker_id, *where)
    try:
        yield proc, wait_registered(etcd, proc, worker_id)
        proc.signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.output()
        assert etcd_workers(etcd) == {}
    finally:
        proc.kill()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infera_core", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=clean_environ(),
    )


def test_sglang_worker_with_stand_in(tmp_path: Path, etcd_server: EtcdServer) -> None:
    env = sglang_env(tmp_path)
    with registered("sglang", env, etcd_server, "qwen", "sglang-1") as (proc, record):
        assert record.engine == "sglang" and record.model == "qwen"
        assert record.kv_events is not None
        assert record.kv_events.format == "sglang" and record.kv_events.block_size == 16
        assert "-m sglang.launch_server --model-path qwen --served-model-name qwen" in proc.output()
        # the stand-in got the KV ports from --kv-events-config: events arrive where the record says
        sub = KvSubscriber(record.kv_events.endpoint, record.kv_events.topic)
        try:
            body = {"model": "qwen", "prompt": "word " * 80, "max_tokens": 2}
            assert httpx.post(f"{record.url}/v1/completions", json=body, timeout=10).status_code == 200
            stored = sub.stored(within=5)
            assert stored and all(e.block_size == 16 for e in stored)
        finally:
            sub.close()


def test_atom_worker_with_stand_in(tmp_path: Path, etcd_server: EtcdServer) -> None:
    env = atom_env(tmp_path)
    with registered("atom", env, etcd_server, "ds", "atom-1") as (proc, record):
        assert record.engine == "atom"
        kv = record.kv_events  # ATOM's own publisher (ATOM_KV_EVENTS_*), no seq frame
        assert kv is not None and kv.format == "atom" and kv.seq_frames is False
        assert "-m atom.entrypoints.openai_server --model ds --served-model-name ds" in proc.output()
        assert "--server-port" in proc.output()
        body = {"model": "ds", "prompt": "hello there", "max_tokens": 2}
        assert httpx.post(f"{record.url}/v1/completions", json=body, timeout=10).status_code == 200


def test_atom_refuses_discovery_other_than_etcd(tmp_path: Path) -> None:
    env = atom_env(tmp_path)
    out = cli("worker", "atom", "--model", "ds", "--engine-python", env.python, "--discovery", "memory")
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "needs --discovery etcd" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_engine_that_dies_at_start_up_shows_its_last_lines(tmp_path: Path) -> None:
    env = sglang_env(tmp_path)
    out = cli(
        "worker", "sglang", "--model", "qwen", "--engine-python", env.python, "--discovery", "memory",
        "--", "--stand-in-exit-code", "7",
    )  # fmt: skip
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    assert "exited with code 7" in out.stderr
    assert "stand-in sglang: failing on purpose with code 7" in out.stderr


@pytest.mark.parametrize(
    ("engine", "package"), [("vllm", "pip install vllm"), ("sglang", "pip install 'sglang[all]'")]
)
def test_engine_not_installed_is_one_clear_line(tmp_path: Path, engine: str, package: str) -> None:
    bare = make_engine_env(tmp_path, None).python
    out = cli("worker", engine, "--model", "m", "--engine-python", bare, "--discovery", "memory")
    assert out.returncode == 1
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert package in out.stderr and "Traceback" not in out.stderr


def test_engines_command_lists_every_engine_with_its_flags() -> None:
    out = cli("engines", "--json")
    assert out.returncode == 0, out.stderr
    engines = {e["name"]: {o["flag"] for o in e["options"]} for e in json.loads(out.stdout)}
    assert {"vllm", "sglang", "atom", "sim"} <= set(engines)
    assert {"--block-size", "--tp", "--pd-connector", "--dp-size", "--dp-rank"} <= engines["vllm"]
    assert {"--page-size", "--tp", "--transfer-backend", "--dp-size"} <= engines["sglang"]
    assert {"--tp", "--block-size", "--handshake-port"} <= engines["atom"]


def test_worker_vllm_help_documents_flags_and_pass_through() -> None:
    out = cli("worker", "vllm", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for flag in ("--engine-python", "--block-size", "--pd-connector", "--etcd-endpoint", "--role"):
        assert flag in text
    assert "Everything after -- is passed to the engine unchanged" in text
    assert "multiples of 32" in text


def test_sglang_pd_pair_from_the_registry_serves_a_request(tmp_path: Path, etcd_server: EtcdServer) -> None:
    """Prefill and decode launchers register their PD params; the transport built from those
    records drives a real bootstrap exchange between the two (stand-in) engines."""
    env = sglang_env(tmp_path)
    common = ["--model", "qwen", "--engine-python", env.python, "--etcd-endpoint", etcd_server.endpoint]
    procs = [
        launch("sglang", "--worker-id", "pre", "--role", "prefill", *common),
        launch("sglang", "--worker-id", "dec", "--role", "decode", *common),
    ]
    try:
        prefill = wait_registered(etcd_server, procs[0], "pre")
        decode = wait_registered(etcd_server, procs[1], "dec")
        check_pair(prefill, decode)
        assert prefill.pd is not None and prefill.pd.params["bootstrap_port"] > 0
        t = SglangBootstrapTransport()
        ctx = PdContext(request_id="pd-1", route="/v1/completions")
        t.prepare(ctx, prefill, decode)
        body = {"model": "qwen", "prompt": "alpha beta gamma " * 20, "max_tokens": 5}
        pre = t.prefill_request(body, ctx, prefill, decode)
        dec = t.decode_request(body, ctx, prefill, decode, None)

        async def both() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as client:
                return list(
                    await asyncio.gather(
                        client.post(decode.url + ctx.route, json=dec.body, headers=dec.headers),
                        client.post(prefill.url + ctx.route, json=pre.body, headers=pre.headers),
                    )
                )

        final, first = asyncio.run(both())
        assert first.status_code == 200 and final.status_code == 200, (first.text, final.text)
        assert final.json()["usage"]["completion_tokens"] == 5
    finally:
        for proc in procs:
            proc.kill()

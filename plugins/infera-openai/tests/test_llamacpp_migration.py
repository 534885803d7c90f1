"""A real llama.cpp engine killed mid-stream: its stream finishes on the other one, byte-identical.

``infera-run up --engine llamacpp --workers 2`` over the real llama-server and the tiny
random-weight GGUF (``test_llamacpp_real.py``). The same chat request (``temperature 0``,
``ignore_eos``, ``max_tokens 128``) is streamed undisturbed, then again with the serving
llama-server killed (SIGKILL) after k chunks: the client must read the same text (the random
weights emit odd bytes; compared exactly anyway), one ``id``, one finish reason and a usage whose
completion tokens are 128. Every worker is llama.cpp, so the router asks for the sampled ids
(``n_probs: 1``, kept out of the client's stream) and continues with llama.cpp's mixed prompt
(the chat rendered by ``/apply-template``, then the generated ids); when llama.cpp left a token
out of its ids (one ending in an unfinished UTF-8 character), the greedy request is replayed
whole and the part the client has is skipped. k = 10 runs by default; k = 1 and k = 60 are
marked slow (the whole llama.cpp suite is slow-marked: it needs ``.venv-llamacpp``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
from test_llamacpp_real import VENV, llama_server, running_up

from infera_core.testing.server import assert_continued_like, chat_stream_text, greedy_chat_stream

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MAX = 128
CHAT = greedy_chat_stream("tiny", MAX)


@pytest.fixture(scope="module")
def slow_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny GGUF's kind, made wider and deeper (512 wide, 8 layers, 127 MB of random F32):
    about 20 ms a token on one thread, so the 128 tokens take seconds and the kill lands while
    llama-server is still generating (the 2-layer tiny one is done in well under 100 ms)."""
    llama_server()  # skips when the llama.cpp venv is not built
    out = tmp_path_factory.mktemp("gguf") / "slow.gguf"
    script = Path(__file__).with_name("make_tiny_gguf.py")
    python = VENV / "bin" / "python"
    subprocess.run([str(python), str(script), str(out), "512", "2048", "8"], check=True, timeout=300)
    return out


def _llama_server_on(port: int) -> psutil.Process:
    """The llama-server process listening on ``port``."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if cmd and "llama-server" in os.path.basename(cmd[0]) and str(port) in cmd:
            i = cmd.index(str(port))
            if i > 0 and cmd[i - 1] == "--port":
                return proc
    raise AssertionError(f"no llama-server on port {port}")


def _stream(
    root: str, workers: dict[str, str], kill_after: int | None = None, body: dict[str, Any] = CHAT
) -> list[dict[str, Any]]:
    """The stream's events; with ``kill_after``, its llama-server is SIGKILLed after that many."""
    events: list[dict[str, Any]] = []
    with (
        httpx.Client(base_url=root, timeout=300) as c,
        c.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200, r.read()
        worker = r.headers["x-infera-worker"]
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
                if kill_after is not None and len(events) == kill_after:
                    port = urlsplit(workers[worker]).port
                    assert port is not None
                    _llama_server_on(port).send_signal(signal.SIGKILL)
    return events


@pytest.mark.parametrize(
    "k", [pytest.param(1, marks=pytest.mark.slow), 10, pytest.param(60, marks=pytest.mark.slow)]
)
def test_a_killed_llama_server_mid_stream_gives_the_same_text(slow_gguf: Path, k: int) -> None:
    with running_up(slot_ctx=4096, model=slow_gguf) as (_, url, _, _):
        root = url.removesuffix("/v1")
        fleet = httpx.get(f"{root}/v1/workers", timeout=10).json()["data"]
        workers = {str(w["worker_id"]): str(w["url"]) for w in fleet}
        assert len(workers) == 2 and {w["engine"] for w in fleet} == {"llamacpp"}
        want = _stream(root, workers)
        got = _stream(root, workers, kill_after=k)
        metrics = httpx.get(f"{root}/metrics", timeout=10).text
    moved = [m for m in metrics.splitlines() if m.startswith("infera_migrations_total{")]
    assert_continued_like(got, want, MAX)
    assert not any("logprobs" in ch for e in got + want for ch in e.get("choices") or [])  # the router's own
    assert any('result="resumed"' in m and not m.endswith(" 0.0") for m in moved), moved


def test_a_sampled_stream_continues_from_llama_cpps_ids(slow_gguf: Path) -> None:
    """``temperature 0.8``: the router asks for ``n_probs: 1`` (none reaches the client) and the
    continuation, a mixed prompt of the rendered chat and the ids, ends the one response: one
    ``id``, one finish reason, 128 completion tokens. (Its worker's record leaves as the stream
    breaks: the cut for ``worker_gone`` must not cancel the continuation being set up.)"""
    sampled = {**CHAT, "temperature": 0.8}
    with running_up(slot_ctx=4096, model=slow_gguf) as (_, url, _, _):
        root = url.removesuffix("/v1")
        workers = {
            str(w["worker_id"]): str(w["url"])
            for w in httpx.get(f"{root}/v1/workers", timeout=10).json()["data"]
        }
        events = _stream(root, workers, kill_after=10, body=sampled)
        metrics = httpx.get(f"{root}/metrics", timeout=10).text
    assert not any("error" in e for e in events), events[-1]
    assert not any("logprobs" in ch for e in events for ch in e.get("choices") or [])
    assert len({e["id"] for e in events}) == 1 and chat_stream_text(events)
    assert [ch["finish_reason"] for e in events for ch in e["choices"] if ch.get("finish_reason")] == [
        "length"
    ]
    usage = [e["usage"] for e in events if e.get("usage")]
    assert len(usage) == 1 and usage[0]["completion_tokens"] == MAX, usage
    moved = [m for m in metrics.splitlines() if m.startswith("infera_migrations_total{")]
    assert any('result="resumed"' in m and m.endswith(" 1.0") for m in moved), moved

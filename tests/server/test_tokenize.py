"""``/tokenize`` and ``/detokenize`` on the router, answered by sim workers in vLLM's shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import aiohttp
import httpx
import pytest
from aiohttp import web

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, serving, settings_for
from infera_core.util.net import free_port
from infera_core.worker import WorkerRecord

pytest.importorskip("infera_sim")
from infera_sim.testing import SimHandle

MODEL = "sim-model"


def _record(worker_id: str, url: str, engine: str = "sim") -> WorkerRecord:
    return WorkerRecord(worker_id=worker_id, url=url, model=MODEL, engine=engine)


@pytest.fixture
async def srv(sims: list[SimHandle]) -> AsyncIterator[RunningServer]:
    async with serving(settings_for(), make_hooks()) as server:
        for i, s in enumerate(sims):
            server.store.put(_record(f"sim{i}", s.url))
        await server.wait_workers(len(sims))
        yield server


# -- what `vllm bench serve` does before a run (vllm/benchmarks/serve.py) -----------------


@dataclass
class SampleRequest:
    prompt: str
    prompt_len: int


async def align_prompts(base_url: str, model: str, requests: list[SampleRequest]) -> list[SampleRequest]:
    """The benchmark client's prompt alignment, with its exact requests: POST {base}/tokenize
    ``{model, prompt, add_special_tokens: false}`` reading ``tokens``, and POST
    {base}/detokenize ``{model, tokens}`` reading ``prompt``; any error means "unavailable"."""
    async with aiohttp.ClientSession() as session:

        async def tokenize(prompt: str) -> list[int]:
            body = {"model": model, "prompt": prompt, "add_special_tokens": False}
            async with session.post(f"{base_url}/tokenize", json=body) as r:
                r.raise_for_status()
                tokens: list[int] = (await r.json())["tokens"]
                return tokens

        async def detokenize(tokens: list[int]) -> str:
            async with session.post(f"{base_url}/detokenize", json={"model": model, "tokens": tokens}) as r:
                r.raise_for_status()
                prompt: str = (await r.json())["prompt"]
                return prompt

        try:
            first = await tokenize(requests[0].prompt)
        except Exception as exc:
            raise AssertionError(f"/tokenize unavailable, skipping alignment ({exc!r})") from exc
        if len(first) == requests[0].prompt_len:
            return requests
        out = []
        for req in requests:
            tokens = await tokenize(req.prompt)
            if len(tokens) > req.prompt_len:
                req = replace(req, prompt=await detokenize(tokens[: req.prompt_len]))
            out.append(req)
        return out


async def test_vllm_bench_prompt_alignment_runs_through_the_router(srv: RunningServer) -> None:
    # the client's local tokenizer thought each prompt was 20 tokens; the server's says more
    requests = [SampleRequest(f"request {i}: " + "alpha beta, gamma delta " * 12, 20) for i in range(5)]
    aligned = await align_prompts(srv.url, MODEL, requests)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        for req in aligned:
            r = await c.post(
                "/tokenize", json={"model": MODEL, "prompt": req.prompt, "add_special_tokens": False}
            )
            assert r.status_code == 200 and r.json()["count"] == 20  # what the benchmark meant to send
            assert r.headers["x-infera-worker"] in {"sim0", "sim1"}


async def test_tokenize_answers_in_vllms_shape_as_the_worker_would(
    srv: RunningServer, sims: list[SimHandle]
) -> None:
    body = {"model": MODEL, "prompt": "Hello there, world"}
    async with httpx.AsyncClient(timeout=10) as c:
        via_router = (await c.post(srv.url + "/tokenize", json=body)).json()
        direct = (await c.post(sims[0].url + "/tokenize", json=body)).json()
        assert via_router == direct
        assert set(via_router) >= {"count", "max_model_len", "tokens"}
        assert via_router["count"] == len(via_router["tokens"]) and via_router["max_model_len"] > 0
        chat = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "add_generation_prompt": True,
        }
        r = await c.post(srv.url + "/tokenize", json=chat)
        assert r.status_code == 200 and r.json()["count"] > 2
        # one model served: `model` may be left out, as with vLLM
        r = await c.post(srv.url + "/tokenize", json={"prompt": "Hello there, world"})
        assert r.status_code == 200 and r.json()["tokens"] == direct["tokens"]
        r = await c.post(srv.url + "/detokenize", json={"tokens": direct["tokens"]})
        assert r.status_code == 200 and r.json() == {"prompt": "<s>Hello there, world"}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model"),
        ("/tokenize", {"model": MODEL}, 400, "prompt"),
        ("/tokenize", {"model": MODEL, "prompt": 3}, 400, "prompt"),
        ("/detokenize", {"model": MODEL, "tokens": [1, -2]}, 400, "tokens"),
        ("/detokenize", {"model": MODEL, "tokens": "1 2"}, 400, "tokens"),
        ("/detokenize", {"model": 7, "tokens": [1]}, 400, "model"),
    ],
)
async def test_bad_requests_get_openai_shaped_4xx(
    srv: RunningServer, path: str, body: dict[str, object], status: int, param: str
) -> None:
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        r = await c.post(path, json=body)
        assert r.status_code == status
        assert r.json()["error"]["param"] == param
        r = await c.post(path, content=b"{not json")
        assert r.status_code == 400 and "error" in r.json()


@pytest.fixture
async def no_tokenize_worker() -> AsyncIterator[str]:
    """An engine without /tokenize: 404 {"detail": "Not Found"} like a FastAPI server."""
    app = web.Application()
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_a_worker_without_the_route_or_down_is_skipped(
    sims: list[SimHandle], no_tokenize_worker: str
) -> None:
    async with serving(settings_for(request_max_retries=2), make_hooks()) as s:
        s.store.put(_record("bare", no_tokenize_worker, engine="bare"))
        s.store.put(_record("down", f"http://127.0.0.1:{free_port()}"))
        await s.wait_workers(2)
        async with httpx.AsyncClient(base_url=s.url, timeout=10) as c:
            r = await c.post("/tokenize", json={"model": MODEL, "prompt": "x"})
            assert r.status_code == 502 and "bare (bare)" in r.json()["error"]["message"]
            s.store.delete("down")
            await s.wait_workers(1)
            r = await c.post("/tokenize", json={"model": MODEL, "prompt": "x"})
            assert r.status_code == 501 and "do not serve /tokenize" in r.json()["error"]["message"]
            s.store.put(_record("sim0", sims[0].url))
            await s.wait_workers(2)
            for _ in range(3):  # whichever is tried first, the sim answers
                r = await c.post("/tokenize", json={"model": MODEL, "prompt": "x"})
                assert r.status_code == 200 and r.headers["x-infera-worker"] == "sim0"

"""Token budgets that cannot be evaded (issue #28, rows 3–5): a stream the client leaves is
charged what was relayed, usage is found wherever it is in an answer, and admission reserves
``prompt + max_tokens × n`` so a request that cannot fit is refused before it runs.

Real HTTP on 127.0.0.1, the sim as the engine (a finite speedup, so streams take time), the
real ``openai`` client where the client side matters."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from infera_core.server.reserve import reservation
from infera_core.server.usage import answer_usage
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, serving, settings_for
from infera_core.worker import WorkerRecord

pytest.importorskip("infera_sim")
from infera_sim.testing import SimHandle, start_sim

MODEL = "sim-model"
ADMIN = "admin-tok"
HI: Any = [{"role": "user", "content": "Hello there"}]
KEYS: dict[str, Any] = {
    "keys": [
        {"name": "k1000", "key": "sk-1000", "tokens_per_day": 1000},
        {"name": "k200", "key": "sk-200", "tokens_per_day": 200},
    ]
}
CHARGED_WITHIN = 15.0
"""Seconds for the router to see a client leave and settle its charge (a loaded 2-core box)."""


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    # real time (5 ms a token): a 300-token stream is still running when the client leaves
    with start_sim(model=MODEL, speedup=1.0, kv_events_port=None, kv_replay_port=None) as s:
        yield s


def _server(tmp: Path, **settings: Any) -> Any:
    keys = tmp / "keys.yaml"
    keys.write_text(yaml.safe_dump(KEYS))
    return serving(settings_for(api_key_file=keys, admin_token=ADMIN, **settings), make_hooks())


@pytest.fixture
async def srv(sim: SimHandle, tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with _server(tmp_path) as server:
        server.store.put(WorkerRecord(worker_id="sim0", url=sim.url, model=MODEL, engine="sim"))
        await server.wait_workers(1)
        yield server


@pytest.fixture
async def clients() -> AsyncIterator[list[openai.AsyncOpenAI]]:
    made: list[openai.AsyncOpenAI] = []
    yield made
    for c in made:
        await c.close()


def _oai(srv: RunningServer, key: str, made: list[openai.AsyncOpenAI]) -> openai.AsyncOpenAI:
    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0)
    made.append(client)
    return client


async def _today(srv: RunningServer, name: str) -> int:
    async with httpx.AsyncClient(base_url=srv.url) as c:
        r = await c.get("/v1/admin/usage", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200
    (key,) = [k for k in r.json()["keys"] if k["key"] == name]
    return int(key["tokens_today"])


async def _charged_at_least(srv: RunningServer, name: str, tokens: int) -> int:
    """Wait until key ``name`` was charged ``tokens`` today; what it was charged."""
    seen = [0]

    async def poll() -> None:
        while True:
            seen[0] = await _today(srv, name)
            if seen[0] >= tokens:
                return
            await asyncio.sleep(0.05)

    try:
        await asyncio.wait_for(poll(), CHARGED_WITHIN)
    except TimeoutError:
        pytest.fail(f"key {name!r} charged {seen[0]} tokens, expected at least {tokens}")
    return seen[0]


async def _sim_metric(sim: SimHandle, name: str) -> float:
    async with httpx.AsyncClient() as c:
        text = (await c.get(sim.url + "/metrics")).text
    m = re.search(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    assert m is not None, text
    return float(m.group(1))


async def _generated(sim: SimHandle) -> float:
    """Tokens the sim generated so far, once it runs nothing (earlier tests' streams aborted)."""

    async def idle() -> None:
        while True:
            running = await _sim_metric(sim, "vllm:num_requests_running")
            if not running and not await _sim_metric(sim, "vllm:num_requests_waiting"):
                return
            await asyncio.sleep(0.05)

    await asyncio.wait_for(idle(), CHARGED_WITHIN)
    return await _sim_metric(sim, "vllm:generation_tokens_total")


# -- row 3: what was generated is charged whether or not the client read it ---------------------


async def _read_then_leave(client: openai.AsyncOpenAI, max_tokens: int, leave_after: int) -> int:
    """Open a stream, read ``leave_after`` content chunks, close the connection; chunks read."""
    stream = await client.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=max_tokens, stream=True, extra_body={"ignore_eos": True}
    )
    read = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            read += 1
            if read >= leave_after:
                break
    await stream.close()  # before the usage chunk: the connection goes away
    return read


async def test_streams_the_client_leaves_are_charged_what_was_relayed(
    srv: RunningServer, clients: list[openai.AsyncOpenAI]
) -> None:
    client = _oai(srv, "sk-1000", clients)
    read, streams = 0, 0
    for _ in range(20):
        try:
            read += await _read_then_leave(client, max_tokens=300, leave_after=100)
        except openai.RateLimitError as err:
            assert err.code == "token_budget_exceeded"
            break
        streams += 1
        await _charged_at_least(srv, "k1000", read)  # each stream left early is charged
    else:
        pytest.fail(f"{read} tokens read on a 1000-token budget, never refused")
    # abandoned streams spent the budget like read ones: the client cannot read past it
    assert streams >= 2 and read <= 1000


async def test_an_anthropic_stream_the_client_leaves_is_charged_too(srv: RunningServer) -> None:
    client = anthropic.AsyncAnthropic(base_url=srv.url, api_key="sk-1000", max_retries=0)
    try:
        stream = await client.messages.create(
            model=MODEL, max_tokens=300, messages=HI, stream=True, extra_body={"ignore_eos": True}
        )
        read = 0
        async for event in stream:
            if event.type == "content_block_delta":
                read += 1
                if read >= 60:
                    break
        await stream.close()
    finally:
        await client.close()
    await _charged_at_least(srv, "k1000", 60)


async def test_a_worker_failing_mid_stream_still_charges_what_was_relayed(
    tmp_path: Path, clients: list[openai.AsyncOpenAI]
) -> None:
    with start_sim(model=MODEL, speedup=1.0, kv_events_port=None, kv_replay_port=None) as doomed:
        async with _server(tmp_path) as server:
            server.store.put(WorkerRecord(worker_id="doomed", url=doomed.url, model=MODEL, engine="sim"))
            await server.wait_workers(1)
            client = _oai(server, "sk-1000", clients)
            stream = await client.chat.completions.create(
                model=MODEL, messages=HI, max_tokens=600, stream=True, extra_body={"ignore_eos": True}
            )
            read = 0
            with pytest.raises(openai.APIError):  # the router ends the stream with an error event
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        read += 1
                        if read == 50:
                            doomed.proc.kill()
            assert read >= 50
            await _charged_at_least(server, "k1000", read)


async def test_concurrent_streams_cannot_overdraw_the_budget(
    srv: RunningServer, sim: SimHandle, clients: list[openai.AsyncOpenAI]
) -> None:
    """4 streams of 300 on a 1000-token day (the attack of row 3): 3 reservations fit, the 4th
    is refused however the streams interleave."""
    client = _oai(srv, "sk-1000", clients)

    async def one() -> int:
        try:
            stream = await client.chat.completions.create(
                model=MODEL, messages=HI, max_tokens=300, stream=True, extra_body={"ignore_eos": True}
            )
        except openai.RateLimitError:
            return -1
        return len([c async for c in stream if c.choices and c.choices[0].delta.content])

    got = await asyncio.gather(*(one() for _ in range(4)))
    assert sorted(got) == [-1, 300, 300, 300]
    assert 900 < await _today(srv, "k1000") <= 1000


# -- row 4: usage found wherever it is -----------------------------------------------------------


async def test_usage_after_prompt_logprobs_is_charged(srv: RunningServer) -> None:
    long = [{"role": "user", "content": " ".join(f"word{i}" for i in range(120))}]
    body = {"model": MODEL, "messages": long, "max_tokens": 3, "prompt_logprobs": 1}
    async with httpx.AsyncClient(base_url=srv.url) as c:
        r = await c.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-1000"})
    assert r.status_code == 200, r.text
    answer = r.json()
    fields = list(answer)
    assert fields.index("usage") < fields.index("prompt_logprobs")  # vLLM's order
    assert b'"usage"' not in r.content[-600:]
    assert await _today(srv, "k1000") == answer["usage"]["total_tokens"] > 120


def test_answer_usage_reads_the_top_level_usage_in_any_field_order() -> None:
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    bulk = [{"5": {"logprob": -0.5, "rank": 1, "decoded_token": "x" * 40}}] * 500
    for answer in (
        {"id": "a", "usage": usage, "prompt_logprobs": bulk},
        {"usage": usage, "choices": [{"text": "hi", "usage": {"prompt_tokens": 999}}]},
        {"choices": [{"message": {"content": '"prompt_tokens": 999'}}], "usage": usage},
    ):
        assert answer_usage(json.dumps(answer).encode()) == (7, 3)
    assert answer_usage(b"[1, 2]") == (0, 0)
    assert answer_usage(b'{"usage": null}') == (0, 0)
    assert answer_usage(b"not json") == (0, 0)


# -- row 5: admission reserves prompt + max_tokens × n ------------------------------------------


async def test_a_request_that_cannot_fit_is_refused_before_it_runs(
    srv: RunningServer, sim: SimHandle, clients: list[openai.AsyncOpenAI]
) -> None:
    client = _oai(srv, "sk-200", clients)
    generated = await _generated(sim)
    with pytest.raises(openai.RateLimitError) as err:
        await client.chat.completions.create(model=MODEL, messages=HI, n=16, max_tokens=3000)
    assert err.value.code == "token_budget_exceeded"
    assert "max_tokens" in err.value.message
    assert "retry-after" not in err.value.response.headers  # it never fits: waiting would not help
    assert await _generated(sim) == generated and await _today(srv, "k200") == 0
    # one that fits runs, and is charged its real usage (not the reservation)
    chat = await client.chat.completions.create(model=MODEL, messages=HI, max_tokens=20)
    assert chat.usage is not None
    spent = chat.usage.total_tokens
    assert await _today(srv, "k200") == spent
    # fits the day's budget but not what is left of it: 429 until the UTC day resets
    fits_a_day = 200 - reservation({"messages": HI}, 0)
    with pytest.raises(openai.RateLimitError) as err:
        await client.chat.completions.create(model=MODEL, messages=HI, max_tokens=fits_a_day)
    assert int(err.value.response.headers["retry-after"]) >= 1
    assert f"has {200 - spent} of its 200 tokens left" in err.value.message
    # no max_tokens: the configured cap is reserved (4096 by default: refused)
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(model=MODEL, messages=HI)
    assert await _generated(sim) == generated + 20  # the one that fit, nothing else


async def test_the_reserved_default_output_is_a_setting(
    sim: SimHandle, tmp_path: Path, clients: list[openai.AsyncOpenAI]
) -> None:
    async with _server(tmp_path, budget_max_tokens=64) as server:
        server.store.put(WorkerRecord(worker_id="sim0", url=sim.url, model=MODEL, engine="sim"))
        await server.wait_workers(1)
        client = _oai(server, "sk-200", clients)
        chat = await client.chat.completions.create(model=MODEL, messages=HI)  # reserves prompt + 64
        assert chat.usage is not None and await _today(server, "k200") == chat.usage.total_tokens
        with pytest.raises(openai.RateLimitError):  # n=4: prompt + 4 × 64 > 200
            await client.chat.completions.create(model=MODEL, messages=HI, n=4)
        # a batched completion reserves per prompt: 3 × 70 never fits a 200-token day, 1 × 70 does
        with pytest.raises(openai.RateLimitError) as err:
            await client.completions.create(model=MODEL, prompt=["a", "b", "c"], max_tokens=70)
        assert "retry-after" not in err.value.response.headers
        await client.completions.create(model=MODEL, prompt="a", max_tokens=70)


def test_reservation_is_prompt_plus_max_tokens_times_n_per_prompt() -> None:
    chat = {"messages": HI, "n": 16, "max_tokens": 3000}
    assert reservation(chat, 4096) == reservation({"messages": HI}, 0) + 48000
    assert reservation({"messages": HI, "max_completion_tokens": 5, "max_tokens": 9}, 4096) == reservation(
        {"messages": HI}, 5
    )
    batch = {"prompt": ["ab", "cd"], "max_tokens": 10, "n": 2}
    assert reservation(batch, 4096) == reservation({"prompt": ["ab", "cd"]}, 0) + 40
    ids = {"prompt": [1, 2, 3], "max_tokens": 1}
    assert reservation(ids, 4096, token_ids=[1, 2, 3]) == 4
    # never below the real count: every byte-level BPE token covers at least one byte
    text = "naïve 日本語 " * 50
    assert reservation({"prompt": text}, 0) >= len(text.encode())

"""--api-key-file: the real ``openai`` and ``anthropic`` clients see 401/403/429 as their typed
errors; tokens are counted per key and model (streams without include_usage too); the file
is re-read when it changes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from infera_core.errors import ConfigError
from infera_core.server.app import create_app
from infera_core.server.errors import ApiError
from infera_core.server.keys import KeyRing
from infera_core.server.usage import UsageStripper, with_stream_usage
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.pd import sim_pd_fleet
from infera_core.testing.server import RunningServer, serving, settings_for
from infera_core.worker import WorkerRecord

pytest.importorskip("infera_sim")
from infera_sim.testing import SimHandle, start_sim

MODEL = "sim-model"
ADMIN = "admin-tok"
KEYS: dict[str, Any] = {
    "keys": [
        {"name": "team-a", "key": "sk-team-a", "models": [MODEL]},
        {"name": "team-b", "key_sha256": hashlib.sha256(b"sk-team-b").hexdigest(), "models": ["other"]},
        {"name": "slow", "key": "sk-slow", "requests_per_minute": 2},
        {"name": "small", "key": "sk-small", "tokens_per_day": 100},
        {"name": "cheap", "key": "sk-cheap", "tokens_per_day": 10**6, "cached_prompt_price": 0.25},
    ]
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(model=MODEL, speedup="inf", kv_events_port=None, kv_replay_port=None) as s:
        yield s


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump(KEYS))
    return path


@pytest.fixture
async def srv(sim: SimHandle, key_file: Path) -> AsyncIterator[RunningServer]:
    async with serving(settings_for(api_key_file=key_file, admin_token=ADMIN), make_hooks()) as server:
        server.store.put(WorkerRecord(worker_id="sim0", url=sim.url, model=MODEL, engine="sim"))
        await server.wait_workers(1)
        yield server


_OPEN: list[openai.AsyncOpenAI | anthropic.AsyncAnthropic] = []


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    while _OPEN:
        await _OPEN.pop().close()


def _oai(srv: RunningServer, key: str) -> openai.AsyncOpenAI:
    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0)
    _OPEN.append(client)
    return client


def _ant(srv: RunningServer, key: str) -> anthropic.AsyncAnthropic:
    client = anthropic.AsyncAnthropic(base_url=srv.url, api_key=key, max_retries=0)
    _OPEN.append(client)
    return client


HI: Any = [{"role": "user", "content": "Hello there"}]


async def _usage(srv: RunningServer) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=srv.url) as c:
        r = await c.get("/v1/admin/usage", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200
    return {k["key"]: k for k in r.json()["keys"]}


async def _both_refuse(
    srv: RunningServer,
    key: str,
    oai_error: type[openai.APIStatusError],
    ant_error: type[anthropic.APIStatusError],
) -> tuple[str | None, str]:
    """A chat with ``key`` fails with ``oai_error`` in the OpenAI SDK and ``ant_error`` in the
    Anthropic one: (OpenAI's error code, Anthropic's error type)."""
    with pytest.raises(oai_error) as oerr:
        await _oai(srv, key).chat.completions.create(model=MODEL, messages=HI, max_tokens=2)
    with pytest.raises(ant_error) as aerr:
        await _ant(srv, key).messages.create(model=MODEL, max_tokens=2, messages=HI)
    return oerr.value.code, aerr.value.body["error"]["type"]  # type: ignore[index]


async def test_missing_or_unknown_key_is_401_for_both_clients(srv: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=srv.url) as c:
        r = await c.post("/v1/chat/completions", json={"model": MODEL, "messages": HI})
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
        assert (await c.get("/v1/models")).status_code == 401
        assert (await c.get("/health")).status_code == 200  # not under /v1
    refused = await _both_refuse(srv, "sk-wrong", openai.AuthenticationError, anthropic.AuthenticationError)
    assert refused == ("invalid_api_key", "authentication_error")


async def test_keys_by_value_or_sha256_and_the_model_allow_list(srv: RunningServer) -> None:
    chat = await _oai(srv, "sk-team-a").chat.completions.create(model=MODEL, messages=HI, max_tokens=3)
    assert chat.choices[0].message.content
    msg = await _ant(srv, "sk-team-a").messages.create(model=MODEL, max_tokens=3, messages=HI)
    assert msg.usage.output_tokens == 3
    assert [m.id for m in (await _oai(srv, "sk-team-a").models.list()).data] == [MODEL]
    # team-b (key given as sha256) may only use "other"
    assert [m.id async for m in _oai(srv, "sk-team-b").models.list()] == []
    refused = await _both_refuse(
        srv, "sk-team-b", openai.PermissionDeniedError, anthropic.PermissionDeniedError
    )
    assert refused == ("model_not_allowed", "permission_error")


async def test_requests_per_minute_budget_is_429(srv: RunningServer) -> None:
    client = _oai(srv, "sk-slow")
    for _ in range(2):
        await client.completions.create(model=MODEL, prompt="a", max_tokens=1)
    with pytest.raises(openai.RateLimitError) as oerr:
        await client.completions.create(model=MODEL, prompt="a", max_tokens=1)
    assert oerr.value.code == "rate_limit_exceeded"
    assert int(oerr.value.response.headers["retry-after"]) >= 1
    with pytest.raises(anthropic.RateLimitError):
        await _ant(srv, "sk-slow").messages.create(model=MODEL, max_tokens=1, messages=HI)


async def test_tokens_per_day_budget_is_429_once_spent(srv: RunningServer) -> None:
    client = _oai(srv, "sk-small")
    await client.chat.completions.create(model=MODEL, messages=HI, max_tokens=50)  # prompt + 50 of 100
    with pytest.raises(openai.RateLimitError) as oerr:  # prompt + 40 more could not fit
        await client.chat.completions.create(model=MODEL, messages=HI, max_tokens=40)
    assert oerr.value.code == "token_budget_exceeded"
    assert int(oerr.value.response.headers["retry-after"]) >= 1
    with pytest.raises(anthropic.RateLimitError):
        await _ant(srv, "sk-small").messages.create(model=MODEL, max_tokens=40, messages=HI)
    assert (await _usage(srv))["small"]["tokens_today"] > 50


async def test_cached_prompt_tokens_count_at_the_keys_cached_prompt_price(srv: RunningServer) -> None:
    client = _oai(srv, "sk-cheap")
    long: Any = [{"role": "user", "content": "the same long question, asked twice " * 20}]
    first = await client.chat.completions.create(model=MODEL, messages=long, max_tokens=2)
    assert first.usage is not None
    spent = (await _usage(srv))["cheap"]["tokens_today"]
    assert spent == first.usage.total_tokens  # nothing cached yet: every token at full price
    again = await client.chat.completions.create(model=MODEL, messages=long, max_tokens=2)
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens or 0
    assert cached > 16
    now = (await _usage(srv))["cheap"]
    # a cached prompt token at a quarter (rounded up), the rest at full price
    assert now["tokens_today"] - spent == again.usage.total_tokens - cached + math.ceil(cached / 4)
    assert now["models_used"][MODEL]["prompt_tokens"] == first.usage.prompt_tokens * 2  # usage: real counts


async def test_stream_tokens_counted_without_include_usage_and_not_shown(srv: RunningServer) -> None:
    client = _oai(srv, "sk-team-a")
    stream = await client.chat.completions.create(model=MODEL, messages=HI, max_tokens=7, stream=True)
    chunks = [c async for c in stream]
    assert chunks and all(c.usage is None and c.choices for c in chunks)  # no usage chunk leaked
    asked = await client.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=5, stream=True, stream_options={"include_usage": True}
    )
    last = [c async for c in asked][-1]
    assert last.usage is not None and last.usage.completion_tokens == 5 and not last.choices
    cstream = await client.completions.create(model=MODEL, prompt="abc", max_tokens=4, stream=True)
    assert all(c.usage is None for c in [c async for c in cstream])
    used = (await _usage(srv))["team-a"]["models_used"][MODEL]
    assert used["completion_tokens"] == 7 + 5 + 4 and used["prompt_tokens"] > 0 and used["requests"] == 3
    async with httpx.AsyncClient(base_url=srv.url) as c:
        text = (await c.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"})).text
    m = re.search(r'infera_key_tokens_total\{key="team-a",kind="completion",model="sim-model"\} (\S+)', text)
    assert m is not None and float(m.group(1)) == 16.0


async def test_anthropic_usage_counted_per_key(srv: RunningServer) -> None:
    client = _ant(srv, "sk-team-a")
    async with client.messages.stream(model=MODEL, max_tokens=4, messages=HI) as stream:
        await stream.get_final_message()
    await client.messages.create(model=MODEL, max_tokens=3, messages=HI)
    used = (await _usage(srv))["team-a"]["models_used"][MODEL]
    assert used["completion_tokens"] == 7 and used["requests"] == 2


async def test_admin_token_is_accepted_as_a_key_without_limits(srv: RunningServer) -> None:
    chat = await _oai(srv, ADMIN).chat.completions.create(model=MODEL, messages=HI, max_tokens=2)
    assert chat.usage is not None
    assert (await _usage(srv))["admin"]["models_used"][MODEL]["requests"] == 1


async def test_key_file_is_reread_when_it_changes(
    srv: RunningServer, key_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    new = {"keys": [{"name": "team-c", "key": "sk-team-c-longer"}, *KEYS["keys"][1:]]}
    await asyncio.to_thread(key_file.write_text, yaml.safe_dump(new))
    client_c = _oai(srv, "sk-team-c-longer")

    async def accepted() -> bool:
        try:
            await client_c.completions.create(model=MODEL, prompt="a", max_tokens=1)
        except openai.AuthenticationError:
            return False
        return True

    async with asyncio.timeout(10):  # the file's mtime is looked at once a second
        while not await accepted():  # noqa: ASYNC110 (a file change has no event to wait on)
            await asyncio.sleep(0.1)
    with pytest.raises(openai.AuthenticationError):
        await _oai(srv, "sk-team-a").completions.create(model=MODEL, prompt="a", max_tokens=1)
    # a broken edit is logged and the keys loaded before stay in force
    with caplog.at_level(logging.ERROR, logger="infera.server.keys"):
        await asyncio.to_thread(key_file.write_text, "keys: [ {name: x} ]\n")
        async with asyncio.timeout(10):
            while not any("keeping the" in r.getMessage() for r in caplog.records):
                await accepted()
                await asyncio.sleep(0.1)
    assert await accepted()
    assert "--api-key-file" in caplog.records[-1].getMessage()


def test_bad_key_file_fails_at_start_naming_the_flag(tmp_path: Path) -> None:
    bad = tmp_path / "k.yaml"
    bad.write_text(yaml.safe_dump({"keys": [{"name": "a", "key": "x", "key_sha256": "0" * 64}]}))
    with pytest.raises(ConfigError, match="--api-key-file"):
        create_app(settings_for(api_key_file=bad), make_hooks())
    with pytest.raises(ConfigError, match="cannot read"):
        create_app(settings_for(api_key_file=tmp_path / "missing.yaml"), make_hooks())


def test_usage_chunk_is_stripped_even_when_split_across_reads() -> None:
    events = (
        b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
        b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
        b"data: [DONE]\n\n"
    )
    for cut in range(1, len(events)):
        strip = UsageStripper()
        out = strip.feed(events[:cut]) + strip.feed(events[cut:]) + strip.flush()
        assert out == events.replace(events.split(b"\n\n")[1] + b"\n\n", b"")
        assert (strip.prompt, strip.completion) == (5, 2)


def test_with_stream_usage_keeps_every_other_field() -> None:
    raw = b' {"model": "m", "stream": true, "messages": []}'
    body = json.loads(raw)
    assert json.loads(with_stream_usage(raw, body)) == {**body, "stream_options": {"include_usage": True}}
    body2 = {**body, "stream_options": {"continuous_usage_stats": False}}
    merged = json.loads(with_stream_usage(json.dumps(body2).encode(), body2))
    assert merged["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}


async def test_pd_streams_are_counted_per_key_too(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"name": "pd", "key": "sk-pd"}]}))
    with sim_pd_fleet("vllm-nixl", prefill=1, decode=1) as fleet:
        async with serving(settings_for(api_key_file=keys), make_hooks()) as server:
            for record in fleet.records:
                server.store.put(record)
            await server.wait_workers(2)
            client = _oai(server, "sk-pd")
            stream = await client.completions.create(model=MODEL, prompt="abc def", max_tokens=6, stream=True)
            chunks = [c async for c in stream]
            assert chunks and all(c.usage is None and c.choices for c in chunks)
            async with httpx.AsyncClient(base_url=server.url) as c:
                usage = (await c.get("/v1/admin/usage")).json()  # loopback: an admin without a token
    used = {k["key"]: k for k in usage["keys"]}["pd"]["models_used"][MODEL]
    assert used["completion_tokens"] == 6 and used["prompt_tokens"] > 0


def test_budgets_refill_per_minute_and_reset_at_utc_midnight(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(
        yaml.safe_dump(
            {"keys": [{"name": "k", "key": "sk", "requests_per_minute": 2, "tokens_per_day": 100}]}
        )
    )
    now, wall = [1000.0], [5 * 86400 + 86000.0]  # 400 s before a UTC midnight
    ring = KeyRing(path, clock=lambda: now[0], wall=lambda: wall[0])
    key = ring.lookup(b"sk")
    assert key is not None and ring.lookup(b"other") is None
    ring.admit(key, "m")
    ring.admit(key, "m")
    with pytest.raises(ApiError) as err:
        ring.admit(key, "m")
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "30"
    now[0] += 30  # one request's worth refilled
    ring.admit(key, "m")
    ring.spent(key, 100)
    now[0] += 60
    with pytest.raises(ApiError) as err:
        ring.admit(key, "m")
    assert err.value.code == "token_budget_exceeded" and err.value.headers["Retry-After"] == "400"
    wall[0] += 400  # a new UTC day
    ring.admit(key, "m")

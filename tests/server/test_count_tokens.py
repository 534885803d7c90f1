"""``POST /v1/messages/count_tokens`` through the official ``anthropic`` SDK against real sims:
answered by the router's own tokenizer when it has one, by a worker otherwise; every
``/v1/messages*`` error in Anthropic's shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infera_core.kv.component import KvRouting
from infera_core.kv.settings import KvSettings
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import eventually, serving, settings_for

anthropic = pytest.importorskip("anthropic")
sim_testing = pytest.importorskip("infera_sim.testing")

MODEL = "sim-model"
SYSTEM = "You are terse."
MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "How many tokens is this question?"},
    {"role": "assistant", "content": [{"type": "text", "text": "Some."}]},
    {"role": "user", "content": "Count them all, please, including the template."},
]


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Any]]:
    with (
        sim_testing.start_sim(model=MODEL, speedup="inf") as with_events,  # the router gets its tokenizer
        sim_testing.start_sim(
            model="plain", speedup="inf", kv_events_port=None, kv_replay_port=None
        ) as plain,
    ):
        yield [with_events, plain]


def engine_count(sim: Any, model: str) -> int:
    """What the engine itself counts for the conversation (its /tokenize of the chat request)."""
    chat = [{"role": "system", "content": SYSTEM}, *[{**m, "content": _text(m["content"])} for m in MESSAGES]]
    r = httpx.post(
        sim.url + "/tokenize", json={"model": model, "messages": chat, "add_generation_prompt": True}
    )
    assert r.status_code == 200, r.text
    return int(r.json()["count"])


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(b["text"] for b in content)


async def test_count_tokens_by_the_router_and_by_a_worker(sims: list[Any]) -> None:
    hooks = make_hooks()
    kv = KvRouting(hooks.catalog(), KvSettings())
    async with serving(settings_for(), hooks, kv=kv) as srv:
        srv.store.put(sims[0].record("sim-0"))
        srv.store.put(sims[1].record("plain-0"))
        await srv.wait_workers(2)
        assert await eventually(lambda: kv.tokenizer(MODEL) is not None, 20)
        assert kv.tokenizer("plain") is None
        client = anthropic.AsyncAnthropic(base_url=srv.url, api_key="unused", max_retries=0)
        try:
            # the router's own tokenizer: no worker asked
            raw = await client.messages.with_raw_response.count_tokens(
                model=MODEL, system=SYSTEM, messages=MESSAGES
            )
            assert "x-infera-worker" not in raw.headers
            assert (await raw.parse()).input_tokens == engine_count(sims[0], MODEL)

            # no tokenizer for "plain": a worker counts (the sim has no count_tokens: its /tokenize)
            raw = await client.messages.with_raw_response.count_tokens(
                model="plain", system=SYSTEM, messages=MESSAGES
            )
            assert raw.headers["x-infera-worker"] == "plain-0"
            assert (await raw.parse()).input_tokens == engine_count(sims[1], "plain")

            with pytest.raises(anthropic.NotFoundError) as nf:
                await client.messages.count_tokens(model="nope", messages=MESSAGES)
            assert nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index,call-overload]
            assert "nope" in nf.value.message

            with pytest.raises(anthropic.BadRequestError) as bad:
                await client.messages.count_tokens(model=MODEL, messages=[])
            assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index,call-overload]
        finally:
            await client.close()

        async with httpx.AsyncClient(base_url=srv.url) as c:
            for method, path, status in [
                ("GET", "/v1/messages", 405),
                ("POST", "/v1/messages/nope", 404),
                ("GET", "/v1/messages/count_tokens", 405),
            ]:
                r = await c.request(method, path, json={})
                assert r.status_code == status, (path, r.text)
                body = r.json()
                assert body["type"] == "error" and body["error"]["type"] and body["error"]["message"], body
            r = await c.post("/v1/messages", json={"model": "nope", "max_tokens": 4, "messages": MESSAGES})
            assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
            r = await c.get("/v1/nope")  # OpenAI routes keep OpenAI's shape
            assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_route"

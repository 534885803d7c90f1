"""The real ``openai`` client talks to a sim process: chat, completions, streaming, errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from infera_sim.testing import SimHandle, start_sim


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(speedup="inf", model="sim-test", max_model_len=512) as handle:
        yield handle


@pytest.fixture
def client(sim: SimHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=sim.url + "/v1", api_key="none", max_retries=0) as client:
        yield client


def test_chat_completion(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model="sim-test", messages=[{"role": "user", "content": "Hello there"}], max_tokens=7
    )
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == 7


def test_completion_text_and_token_ids(client: openai.OpenAI) -> None:
    text = client.completions.create(model="sim-test", prompt="one two three", max_tokens=3)
    ids = client.completions.create(model="sim-test", prompt=[1, 500, 600, 700], max_tokens=3)
    batch = client.completions.create(model="sim-test", prompt=["a b", "c d"], max_tokens=2, n=2)
    assert text.choices[0].text and ids.choices[0].text
    assert sorted(c.index for c in batch.choices) == [0, 1, 2, 3]
    assert batch.usage is not None and batch.usage.completion_tokens == 8


def test_streaming_chat_matches_non_streaming(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "stream me something"}]
    full = client.chat.completions.create(model="sim-test", messages=messages, max_tokens=6, seed=3)
    chunks = list(
        client.chat.completions.create(
            model="sim-test",
            messages=messages,
            max_tokens=6,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]


def test_streaming_completion(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="sim-test", prompt="go", max_tokens=4, stream=True))
    assert sum(1 for c in chunks if c.choices and c.choices[0].text) == 4


def test_stop_string_cuts_the_output(client: openai.OpenAI) -> None:
    full = client.completions.create(model="sim-test", prompt="stop test", max_tokens=8, seed=1)
    words = full.choices[0].text.split()
    stopped = client.completions.create(
        model="sim-test", prompt="stop test", max_tokens=8, seed=1, stop=[words[3]]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert words[3] not in stopped.choices[0].text
    assert full.choices[0].text.startswith(stopped.choices[0].text)


def test_forced_tool_call(client: openai.OpenAI) -> None:
    tools: Any = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    resp = client.chat.completions.create(
        model="sim-test",
        messages=[{"role": "user", "content": "weather?"}],
        tools=tools,
        tool_choice="required",
        max_tokens=3,
    )
    call = resp.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert resp.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"  # type: ignore[union-attr]


def test_bad_requests_are_openai_shaped(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model="sim-test", prompt="word " * 600, max_tokens=1)
    assert "maximum context length" in str(too_long.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="sim-test", messages=[], max_tokens=1)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other-model", prompt="x", max_tokens=1)
    models = client.models.list()
    assert [m.id for m in models.data] == ["sim-test"]


def test_bad_json_and_bad_fields(sim: SimHandle) -> None:
    with httpx.Client(base_url=sim.url) as http:
        broken = http.post(
            "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        n_bad = http.post("/v1/completions", json={"prompt": "x", "n": "two"})
        too_many = http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}
        )
        ok = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "some_new_field": {"a": 1}})
    for resp, param in ((broken, None), (n_bad, "n"), (too_many, "max_tokens")):
        assert resp.status_code == 400
        error = resp.json()["error"]
        assert error["type"] == "BadRequestError" and error["code"] == 400 and error["param"] == param
    assert ok.status_code == 200


def test_prompt_logprobs_where_vllm_puts_them(sim: SimHandle) -> None:
    """vLLM's ``prompt_logprobs``: None for the first prompt token, then one entry per token;
    after ``usage`` in a chat answer, in each choice of a completion; refused with a stream."""
    with httpx.Client(base_url=sim.url) as http:
        chat = http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "a b c"}], "max_tokens": 1, "prompt_logprobs": 1},
        ).json()
        comp = http.post(
            "/v1/completions", json={"prompt": "a b c", "max_tokens": 1, "prompt_logprobs": 0}
        ).json()
        streamed = http.post(
            "/v1/completions", json={"prompt": "a", "max_tokens": 1, "prompt_logprobs": 1, "stream": True}
        )
    fields = list(chat)
    assert fields.index("usage") < fields.index("prompt_logprobs")
    logprobs = chat["prompt_logprobs"]
    assert len(logprobs) == chat["usage"]["prompt_tokens"] and logprobs[0] is None
    (entry,) = logprobs[1].values()
    assert entry["rank"] == 1 and entry["logprob"] < 0 and isinstance(entry["decoded_token"], str)
    (choice,) = comp["choices"]
    assert len(choice["prompt_logprobs"]) == comp["usage"]["prompt_tokens"]
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "prompt_logprobs"

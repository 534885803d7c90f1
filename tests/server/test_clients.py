"""The real ``openai`` and ``anthropic`` clients against the server in front of sim workers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest

from infera_core.testing.server import RunningServer

pytest.importorskip("infera_sim")

MODEL = "sim-model"
TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


@pytest.fixture
async def claude(srv: RunningServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """An Anthropic client, closed after the test."""
    async with anthropic.AsyncAnthropic(base_url=srv.url, api_key="unused", max_retries=0) as client:
        yield client


async def test_openai_chat_and_completions(oai: openai.AsyncOpenAI) -> None:
    client = oai
    chat = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}], max_tokens=8
    )
    assert chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.completion_tokens == 8
    comp = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5)
    assert comp.choices[0].text and comp.usage is not None and comp.usage.completion_tokens == 5
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    with pytest.raises(openai.NotFoundError) as err:
        await client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    assert MODEL in str(err.value)
    with pytest.raises(openai.BadRequestError):
        await client.completions.create(model=MODEL, prompt=[])


async def test_openai_streaming(oai: openai.AsyncOpenAI) -> None:
    client = oai
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream please"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    text = []
    usage = None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert "".join(text)
    assert usage is not None and usage.completion_tokens == 12
    cstream = await client.completions.create(model=MODEL, prompt="abc", max_tokens=4, stream=True)
    pieces = [c.choices[0].text async for c in cstream if c.choices]
    assert len("".join(pieces)) > 0


async def test_anthropic_text_and_streaming(claude: anthropic.AsyncAnthropic) -> None:
    client = claude
    msg = await client.messages.create(
        model=MODEL,
        max_tokens=6,
        system=[{"type": "text", "text": "You are terse."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say hi"}]}],
    )
    assert msg.role == "assistant" and msg.content[0].type == "text" and msg.content[0].text
    assert msg.stop_reason == "max_tokens"
    assert msg.usage.output_tokens == 6 and msg.usage.input_tokens > 0
    async with client.messages.stream(
        model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Stream"}]
    ) as stream:
        streamed = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert streamed and final.content[0].type == "text" and final.content[0].text == streamed
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5


async def test_anthropic_tools_round_trip(claude: anthropic.AsyncAnthropic) -> None:
    client = claude
    msg = await client.messages.create(
        model=MODEL,
        max_tokens=20,
        tools=TOOLS,
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    assert msg.stop_reason == "tool_use"
    use = next(b for b in msg.content if b.type == "tool_use")
    assert use.name == "get_weather" and isinstance(use.input, dict)
    async with client.messages.stream(
        model=MODEL,
        max_tokens=20,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    ) as stream:
        final = await stream.get_final_message()
    streamed_use = next(b for b in final.content if b.type == "tool_use")
    assert streamed_use.name == "get_weather" and isinstance(streamed_use.input, dict) and streamed_use.input
    assert final.stop_reason == "tool_use"
    follow = await client.messages.create(
        model=MODEL,
        max_tokens=5,
        tools=TOOLS,
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21C"}],
            },
        ],
    )
    assert follow.content[0].type == "text" and follow.stop_reason in {"end_turn", "max_tokens"}


async def test_anthropic_multimodal_is_a_clear_400(claude: anthropic.AsyncAnthropic) -> None:
    client = claude
    image: Any = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    with pytest.raises(anthropic.BadRequestError) as err:
        await client.messages.create(
            model=MODEL,
            max_tokens=5,
            messages=[{"role": "user", "content": [image, {"type": "text", "text": "what is this?"}]}],
        )
    assert "multimodal" in str(err.value) and "image" in str(err.value)
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])

"""A deterministic corpus of chat requests for the router ↔ engine token agreement test.

:func:`chat_corpus` returns ``n`` requests generated from a fixed seed: multi-turn
conversations, system and developer prompts, participant names, content-part lists (in
every role), tools with assistant tool calls (JSON arguments, empty, malformed, not an
object) and tool results, reasoning, ``add_generation_prompt`` true and false,
``continue_final_message``, ``chat_template_kwargs``, and Anthropic ``/v1/messages``
bodies (``route`` ``/v1/messages``: map them with the server's mapping before use).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

WORDS = ["the", "of", "to", "and", "kalomi", "raturu", "senovi", "peda", "zefo", "giha", "a", "is", "in"]
WORDS += ["that", "it", "for", "you", "ünï", "naïve", "<b>", "&", '"q"', "日本", "x\ty", "  two  "]
CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"


@dataclass
class ChatCase:
    """One request: ``route`` and its JSON ``body`` (without ``model``)."""

    name: str
    route: str
    body: dict[str, Any]


def _text(rng: random.Random, lo: int = 2, hi: int = 30) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    text = " ".join(words)
    if rng.random() < 0.2:
        text += rng.choice(["\n", "\n\n", " ", "?", "!\n- item"])
    return text


def _content(rng: random.Random) -> Any:
    if rng.random() < 0.3:
        parts: list[Any] = [{"type": "text", "text": _text(rng)} for _ in range(rng.randint(1, 3))]
        return parts
    return _text(rng)


def _tools(rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for i in range(rng.randint(0, 3)):
        fn: dict[str, Any] = {"name": f"tool_{i}_{rng.choice(['get', 'set', 'find'])}"}
        if rng.random() < 0.7:
            fn["description"] = _text(rng, 2, 8)
        if rng.random() < 0.8:
            props = {f"p{j}": {"type": rng.choice(["string", "integer"])} for j in range(rng.randint(0, 3))}
            fn["parameters"] = {"type": "object", "properties": props, "required": sorted(props)[:1]}
        if rng.random() < 0.1:
            fn["strict"] = True
        out.append({"type": "function", "function": fn})
    return out


def _arguments(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.08:
        return ""
    if roll < 0.12:
        return "{not json"
    if roll < 0.15:
        return "[1, 2]"
    return json.dumps({"b": _text(rng, 1, 3), "a": rng.randint(0, 99), "z": [True, None]})


def _turns(rng: random.Random, tools: list[dict[str, Any]] | None, rounds: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    for r in range(rounds):
        user: dict[str, Any] = {"role": "user", "content": _content(rng)}
        if rng.random() < 0.1:
            user["name"] = rng.choice(["ann", "bo"])
        msgs.append(user)
        if r == rounds - 1 and rng.random() < 0.6:
            break
        if tools and rng.random() < 0.5:
            calls = [
                {
                    "id": f"call_{r}_{k}",
                    "type": "function",
                    "function": {"name": rng.choice(tools)["function"]["name"], "arguments": _arguments(rng)},
                }
                for k in range(rng.randint(1, 2))
            ]
            msgs.append(
                {
                    "role": "assistant",
                    "content": _text(rng) if rng.random() < 0.4 else None,
                    "tool_calls": calls,
                }
            )
            for call in calls:
                msgs.append({"role": "tool", "tool_call_id": call["id"], "content": _content(rng)})
        assistant: dict[str, Any] = {"role": "assistant", "content": _content(rng)}
        if rng.random() < 0.1:
            assistant["reasoning"] = _text(rng, 2, 6)
        msgs.append(assistant)
    return msgs


def _chat(rng: random.Random, i: int) -> ChatCase:
    with_tools = rng.random() < 0.4
    tools = _tools(rng) if with_tools else None
    msgs = _turns(rng, tools, rng.randint(1, 4))
    roll = rng.random()
    if roll < 0.5:
        msgs.insert(0, {"role": "system", "content": _content(rng)})
    elif roll < 0.6:
        msgs.insert(0, {"role": "developer", "content": _content(rng)})
        if rng.random() < 0.5:
            msgs.insert(0, {"role": "system", "content": _text(rng)})
    body: dict[str, Any] = {"messages": msgs}
    if tools is not None:
        body["tools"] = tools
    if msgs[-1]["role"] == "assistant" and rng.random() < 0.5:
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
        msgs[-1].pop("tool_calls", None)
        if not msgs[-1].get("content"):
            msgs[-1]["content"] = _text(rng)
    elif rng.random() < 0.25:
        body["add_generation_prompt"] = False
    elif rng.random() < 0.3:
        body["add_generation_prompt"] = True
    if rng.random() < 0.15:
        body["chat_template_kwargs"] = {"default_system": _text(rng, 2, 6)}
    return ChatCase(f"chat-{i}", CHAT, body)


def _anthropic(rng: random.Random, i: int) -> ChatCase:
    tools = [
        {"name": f"tool_{k}", "description": _text(rng, 2, 6), "input_schema": {"type": "object"}}
        for k in range(rng.randint(0, 2))
    ]
    msgs: list[dict[str, Any]] = []
    for r in range(rng.randint(1, 3)):
        if r and tools and rng.random() < 0.5:
            msgs.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": _text(rng)},
                        {
                            "type": "tool_use",
                            "id": f"tu_{r}",
                            "name": tools[0]["name"],
                            "input": {"q": _text(rng, 1, 3)},
                        },
                    ],
                }
            )
            msgs.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": f"tu_{r}", "content": _text(rng)}],
                }
            )
            msgs.append({"role": "assistant", "content": _text(rng)})
        blocks = [{"type": "text", "text": _text(rng)} for _ in range(rng.randint(1, 2))]
        msgs.append({"role": "user", "content": blocks if rng.random() < 0.5 else _text(rng)})
        if rng.random() < 0.5:
            msgs.append({"role": "assistant", "content": _text(rng)})
    if msgs[-1]["role"] == "assistant":
        msgs.append({"role": "user", "content": _text(rng)})
    body: dict[str, Any] = {"max_tokens": 8, "messages": msgs}
    if rng.random() < 0.6:
        body["system"] = _text(rng) if rng.random() < 0.5 else [{"type": "text", "text": _text(rng)}]
    if tools:
        body["tools"] = tools
    return ChatCase(f"messages-{i}", MESSAGES, body)


def chat_corpus(n: int = 240, seed: int = 27) -> list[ChatCase]:
    """``n`` requests, one in six an Anthropic ``/v1/messages`` body."""
    rng = random.Random(seed)
    return [_anthropic(rng, i) if i % 6 == 5 else _chat(rng, i) for i in range(n)]

"""The chat messages a Responses API request (``POST /v1/responses``) stands for.

``instructions`` become a system message, a string ``input`` one user message, and an array
``input`` its message, ``function_call`` and ``function_call_output`` items, in order: the
conversation vLLM builds before applying the chat template (without a previous response's
turns, which only the engine that stored it holds). The router tokenizes the result to route
by cached prefix; the sim generates from it. Items it cannot read as text (images, files,
reasoning) are skipped here: the engine judges them.
"""

from __future__ import annotations

from typing import Any

_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def content_text(content: object) -> str | None:
    """The text of a message's ``content``: a string, or the text of its text parts (None
    when it is neither)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    parts: list[str] = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in _TEXT_PARTS:
            text = part.get("text", part.get("refusal"))
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts)


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a Responses request's ``instructions`` and ``input``."""
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        out.append({"role": "user", "content": items})
        return out
    if not isinstance(items, list):
        return out
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            role, text = item.get("role"), content_text(item.get("content"))
            if isinstance(role, str) and text is not None:
                out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id", "")),
                "type": "function",
                "function": {"name": str(item.get("name", "")), "arguments": str(item.get("arguments", ""))},
            }
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else content_text(output)
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text or ""})
    return out

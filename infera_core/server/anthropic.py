"""Anthropic Messages ↔ OpenAI chat completions (requests and non-streaming responses).

Supported: ``system`` (string or text blocks), text content, ``tool_use`` /
``tool_result`` blocks, ``tools`` and ``tool_choice``, ``stop_sequences``,
sampling parameters, ``metadata.user_id`` (→ ``user``, used by session affinity).
Images, documents and other non-text blocks are refused with a clear 400.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

from infera_core.server.errors import bad_request

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "end_turn",
}


def _blocks(content: Any, where: str) -> Iterator[tuple[int, Any, dict[str, Any]]]:
    """(index, type, block) of a content-block array; 400 for anything else."""
    if not isinstance(content, list):
        raise bad_request(f"'{where}' must be a string or an array of content blocks.", where, "invalid_type")
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            raise bad_request(
                f"'{where}[{i}]' must be a content block object.", f"{where}[{i}]", "invalid_type"
            )
        yield i, block.get("type"), block


def _text_of(content: Any, where: str) -> str:
    """Concatenated text of a string or a list of text blocks."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for i, kind, block in _blocks(content, where):
        if kind == "text":
            text = block.get("text")
            if not isinstance(text, str):
                raise bad_request(
                    f"'{where}[{i}].text' must be a string.", f"{where}[{i}].text", "invalid_type"
                )
            parts.append(text)
        else:
            raise _unsupported(kind, f"{where}[{i}]")
    return "".join(parts)


def _unsupported(kind: Any, where: str) -> Exception:
    if kind in ("image", "document", "audio", "video", "file"):
        return bad_request(
            f"Content block '{where}' of type {kind!r} is not supported: this server only accepts text "
            "(multimodal input is not supported yet).",
            where,
            "unsupported_content",
        )
    return bad_request(
        f"Content block '{where}' has an unsupported type {kind!r}.", where, "unsupported_content"
    )


def _user_message(content: Any, where: str, out: list[dict[str, Any]]) -> None:
    if isinstance(content, str):
        out.append({"role": "user", "content": content})
        return
    text: list[str] = []
    for i, kind, block in _blocks(content, where):
        if kind == "tool_result":
            tool_id = block.get("tool_use_id")
            if not isinstance(tool_id, str):
                raise bad_request(
                    f"'{where}[{i}].tool_use_id' must be a string.",
                    f"{where}[{i}].tool_use_id",
                    "invalid_type",
                )
            result = block.get("content", "")
            result_text = _text_of(result, f"{where}[{i}].content") if result is not None else ""
            if block.get("is_error"):
                result_text = f"Error: {result_text}"
            out.append({"role": "tool", "tool_call_id": tool_id, "content": result_text})
        elif kind == "text":
            text.append(_text_of([block], where))
        else:
            raise _unsupported(kind, f"{where}[{i}]")
    if text:
        out.append({"role": "user", "content": "".join(text)})


def _assistant_message(content: Any, where: str, out: list[dict[str, Any]]) -> None:
    if isinstance(content, str):
        out.append({"role": "assistant", "content": content})
        return
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, kind, block in _blocks(content, where):
        if kind == "text":
            text.append(_text_of([block], where))
        elif kind == "tool_use":
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name", "")),
                        "arguments": json.dumps(block.get("input", {})),
                    },
                }
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise _unsupported(kind, f"{where}[{i}]")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None}
    if calls:
        msg["tool_calls"] = calls
    out.append(msg)


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array.", "tools", "invalid_type")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise bad_request(
                f"'tools[{i}]' must be an object with a string 'name'.", f"tools[{i}]", "invalid_type"
            )
        fn: dict[str, Any] = {
            "name": tool["name"],
            "parameters": tool.get("input_schema") or {"type": "object"},
        }
        if tool.get("description"):
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        raise bad_request("'tool_choice' must be an object.", "tool_choice", "invalid_type")
    kind = choice.get("type")
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request("'tool_choice.type' must be auto, any, none or tool (with a name).", "tool_choice")


def to_chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion request equivalent to an (already validated) Messages request."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": _text_of(system, "system")})
    for i, m in enumerate(body["messages"]):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"'{where}' must be an object.", where, "invalid_type")
        role = m.get("role")
        content = m.get("content")
        if role == "user":
            _user_message(content, f"{where}.content", messages)
        elif role == "assistant":
            _assistant_message(content, f"{where}.content", messages)
        else:
            raise bad_request(
                f"'{where}.role' must be 'user' or 'assistant'.", f"{where}.role", "invalid_value"
            )
    chat: dict[str, Any] = {"model": body["model"], "messages": messages, "max_tokens": body["max_tokens"]}
    for key in ("temperature", "top_p", "top_k", "cache_salt"):  # cache_salt: vLLM's, on both APIs
        if key in body:
            chat[key] = body[key]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        chat["user"] = metadata["user_id"]
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def _parse_args(raw: Any) -> Any:
    if isinstance(raw, dict):
        return raw
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return {"_raw": raw}


def stop_reason(finish: Any, text: str, stops: Any) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) for an OpenAI ``finish_reason``."""
    if finish is None:
        return None, None
    reason = STOP_REASONS.get(str(finish), "end_turn")
    if reason == "end_turn" and isinstance(stops, list):
        for s in stops:
            if isinstance(s, str) and s and text.endswith(s):
                return "stop_sequence", s
    return reason, None


def to_message_response(chat: dict[str, Any], model: str, stops: Any = None) -> dict[str, Any]:
    """A Messages response from a chat completion response."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    msg = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    text = msg.get("content") or ""
    if text:
        content.append({"type": "text", "text": text})
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or "toolu_" + uuid.uuid4().hex[:24],
                "name": fn.get("name", ""),
                "input": _parse_args(fn.get("arguments")),
            }
        )
    reason, seq = stop_reason(choice.get("finish_reason"), text, stops)
    usage = chat.get("usage") or {}
    return {
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": chat.get("model") or model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": {
            "input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0),
        },
    }

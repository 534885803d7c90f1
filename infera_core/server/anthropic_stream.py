"""Chat-completion SSE chunks → Anthropic Messages streaming events.

Emits ``message_start``, then per content block ``content_block_start`` /
``content_block_delta`` (``text_delta`` or ``input_json_delta``) /
``content_block_stop``, then ``message_delta`` (stop reason, usage) and
``message_stop``.
"""

from __future__ import annotations

import json
from typing import Any

from infera_core.server.anthropic import message_id, stop_reason


def event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class MessageStream:
    """Incremental translator; feed upstream bytes, get Anthropic SSE bytes back."""

    def __init__(self, model: str, stops: Any = None) -> None:
        self.model = model
        self.stops = stops
        self._buf = b""
        self._started = False
        self._ended = False
        self._block = -1
        self._block_kind: str | None = None
        self._tools: dict[int, int] = {}
        self._text: list[str] = []
        self._finish: Any = None
        self.input_tokens = 0
        self.output_tokens = 0
        self.events = 0
        """Upstream events translated (what the key is charged when no usage report comes)."""

    def _start(self, out: list[bytes]) -> None:
        if self._started:
            return
        self._started = True
        message: dict[str, Any] = {
            "id": message_id(),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        out.append(event("message_start", {"type": "message_start", "message": message}))

    def _close_block(self, out: list[bytes]) -> None:
        if self._block_kind is not None:
            out.append(event("content_block_stop", {"type": "content_block_stop", "index": self._block}))
            self._block_kind = None

    def _open_block(self, out: list[bytes], kind: str, block: dict[str, Any]) -> None:
        self._close_block(out)
        self._block += 1
        self._block_kind = kind
        out.append(
            event(
                "content_block_start",
                {"type": "content_block_start", "index": self._block, "content_block": block},
            )
        )

    def feed(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue
            try:
                data = json.loads(payload)
            except ValueError:
                continue
            if isinstance(data, dict):
                self.events += 1
                self._chunk(data, out)
        return b"".join(out)

    def _chunk(self, data: dict[str, Any], out: list[bytes]) -> None:
        self._start(out)
        if isinstance(data.get("error"), dict):
            out.append(self.error(str(data["error"].get("message", "upstream error"))))
            return
        usage = data.get("usage")
        if isinstance(usage, dict):
            self.input_tokens = int(usage.get("prompt_tokens") or self.input_tokens)
            self.output_tokens = int(usage.get("completion_tokens") or self.output_tokens)
        for choice in data.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                if self._block_kind != "text":
                    self._open_block(out, "text", {"type": "text", "text": ""})
                self._text.append(text)
                out.append(
                    event(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": self._block,
                            "delta": {"type": "text_delta", "text": text},
                        },
                    )
                )
            for call in delta.get("tool_calls") or []:
                self._tool_delta(call, out)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]

    def _tool_delta(self, call: dict[str, Any], out: list[bytes]) -> None:
        idx = int(call.get("index", 0))
        fn = call.get("function") or {}
        if idx not in self._tools:
            self._open_block(
                out,
                "tool",
                {
                    "type": "tool_use",
                    "id": call.get("id") or f"toolu_{idx}",
                    "name": fn.get("name", ""),
                    "input": {},
                },
            )
            self._tools[idx] = self._block
        args = fn.get("arguments")
        if args:
            out.append(
                event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": self._tools[idx],
                        "delta": {"type": "input_json_delta", "partial_json": args},
                    },
                )
            )

    def finish(self) -> bytes:
        """The closing events (call once, after the upstream stream ended)."""
        if self._ended:
            return b""
        self._ended = True
        out: list[bytes] = []
        self._start(out)
        self._close_block(out)
        reason, seq = stop_reason(self._finish or "stop", "".join(self._text), self.stops)
        out.append(
            event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": seq},
                    "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens},
                },
            )
        )
        out.append(event("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def error(self, message: str) -> bytes:
        self._ended = True
        return event("error", {"type": "error", "error": {"type": "api_error", "message": message}})

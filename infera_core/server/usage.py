"""Token usage per API key and model, and getting it from streams that did not ask for it.

* :class:`UsageLedger` — ``infera_key_tokens_total{key,model,kind}`` and the JSON of
  ``GET /v1/admin/usage``.
* :func:`with_stream_usage` — the upstream body of a stream whose client did not set
  ``stream_options.include_usage``: the engine is asked for usage anyway.
* :class:`UsageStripper` — takes that usage chunk (``"choices": []`` + ``usage``) back
  out of what the client receives, and remembers its counts.
* :func:`answer_usage` — the top-level ``usage`` of a non-streaming answer, wherever it is.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from infera_core.server.series import CounterChild, LeanCounter

_INCLUDE_USAGE = b'"stream_options":{"include_usage":true},'


class _Row:
    """One (key, model): its request count and token counters (made on first use)."""

    __slots__ = ("cached", "completion", "prompt", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.prompt: CounterChild | None = None
        self.completion: CounterChild | None = None
        self.cached: CounterChild | None = None


class UsageLedger:
    """Prompt/completion tokens, the prompt tokens the engine found cached, and requests per
    (key, model), kept on the event loop (a tenant's prefix-cache hit: cached / prompt)."""

    def __init__(self) -> None:
        self.tokens = LeanCounter(
            "infera_key_tokens",
            "Tokens charged per API key (engines' usage, else the router's count)",
            ["key", "model", "kind"],
        )
        self.cached = LeanCounter(
            "infera_key_cached_tokens",
            "Prompt tokens per API key that the engine found in its prefix cache (its usage report)",
            ["key", "model"],
        )
        self._rows: dict[tuple[str, str], _Row] = {}

    def add(self, key: str, model: str, prompt: int, completion: int, cached: int = 0) -> None:
        k = (key, model)
        row = self._rows.get(k)
        if row is None:
            row = self._rows[k] = _Row()
        row.requests += 1
        if prompt:
            if row.prompt is None:
                row.prompt = self.tokens.child((key, model, "prompt"))
            row.prompt.value += prompt
        if completion:
            if row.completion is None:
                row.completion = self.tokens.child((key, model, "completion"))
            row.completion.value += completion
        if cached:
            if row.cached is None:
                row.cached = self.cached.child((key, model))
            row.cached.value += cached

    def by_key(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{key: {model: {prompt_tokens, completion_tokens, cached_tokens, requests}}}``."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for (key, model), row in self._rows.items():
            n = row.requests
            entry = out.setdefault(key, {}).setdefault(
                model, {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0, "requests": 0}
            )
            entry["requests"] = n
        for (key, model, kind), child in self.tokens.children.items():
            entry = out.setdefault(key, {}).setdefault(
                model, {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0, "requests": 0}
            )
            entry[f"{kind}_tokens"] = int(child.value)
        for (key, model), child in self.cached.children.items():
            out[key][model]["cached_tokens"] = int(child.value)
        return out


class _Answer(msgspec.Struct):
    """The one field of an answer the budget needs; msgspec skips every other field without
    building it (a vLLM answer with ``prompt_logprobs`` can be megabytes after ``usage``)."""

    usage: dict[str, Any] | None = None


_ANSWER = msgspec.json.Decoder(_Answer)


def answer_usage(data: bytes) -> tuple[int, int]:
    """(prompt, completion) tokens of a non-streaming answer's top-level ``usage``, whatever
    the order of its fields; (0, 0) when it has none or is not a JSON object."""
    try:
        usage = _ANSWER.decode(data).usage
    except (msgspec.DecodeError, msgspec.ValidationError):
        return 0, 0
    if usage is None:
        return 0, 0
    return _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))


class AddedStreamOptions(dict[str, Any]):
    """``stream_options`` the router set (not the client): its usage chunk is not shown."""


def client_wants_usage(body: dict[str, Any]) -> bool:
    opts = body.get("stream_options")
    return isinstance(opts, dict) and opts.get("include_usage") is True


def asking_usage(body: dict[str, Any]) -> dict[str, Any]:
    """A copy of the parsed ``body`` asking for stream usage (what PD legs are built from)."""
    opts = body.get("stream_options")
    return {
        **body,
        "stream_options": AddedStreamOptions(
            {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
        ),
    }


def router_added_usage(body: dict[str, Any]) -> bool:
    """True for a body from :func:`asking_usage`: strip the usage chunk from the client's stream."""
    return isinstance(body.get("stream_options"), AddedStreamOptions)


def with_stream_usage(raw: bytes, body: dict[str, Any]) -> bytes:
    """``raw`` (the client's JSON object) with ``stream_options.include_usage`` set.

    Without a ``stream_options`` key the field is spliced in after the opening brace
    (no re-encoding of a large body); otherwise the object is re-encoded.
    """
    if "stream_options" not in body:
        i = raw.find(b"{")
        return raw[: i + 1] + _INCLUDE_USAGE + raw[i + 1 :]
    opts = body["stream_options"]
    merged = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
    return json.dumps({**body, "stream_options": merged}).encode()


class UsageStripper:
    """Feed it the worker's SSE bytes; it returns them without the usage-only event.

    Bytes are passed on up to the last complete event (``\\n\\n``); a partial event
    waits for its end. Only events that mention ``"usage"`` are parsed.
    """

    __slots__ = ("buf", "cached", "completion", "prompt")

    def __init__(self) -> None:
        self.buf = b""
        self.prompt = 0
        self.completion = 0
        self.cached = 0
        """The report's ``prompt_tokens_details.cached_tokens``."""

    def feed(self, chunk: bytes) -> bytes:
        if not self.buf and chunk[-2:] == b"\n\n" and b'"usage"' not in chunk:
            return chunk  # whole events, none of them usage: the common case, no copy
        data = self.buf + chunk if self.buf else chunk
        cut = data.rfind(b"\n\n")
        if cut < 0:
            self.buf = data
            return b""
        head, self.buf = data[: cut + 2], data[cut + 2 :]
        if b'"usage"' not in head:
            return head
        kept = [ev for ev in head.split(b"\n\n")[:-1] if not self._usage_event(ev)]
        return b"".join(ev + b"\n\n" for ev in kept)

    def flush(self) -> bytes:
        rest, self.buf = self.buf, b""
        return rest

    def _usage_event(self, event: bytes) -> bool:
        if b'"usage"' not in event:
            return False
        payload = event.strip()
        if not payload.startswith(b"data:"):
            return False
        try:
            obj = json.loads(payload[5:])
        except ValueError:
            return False
        if not isinstance(obj, dict) or obj.get("choices") != [] or not isinstance(obj.get("usage"), dict):
            return False
        usage = obj["usage"]
        self.prompt = _int(usage.get("prompt_tokens"))
        self.completion = _int(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        self.cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
        return True


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

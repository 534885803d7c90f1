"""Seamless continuation: what a broken stream becomes on another worker.

A stream that breaks after its first byte (the worker's connection reset or closed, its
engine killed, silent past ``--stream-idle-timeout``, cut by a drain) is *migrated*: the
router reads back what it already relayed to the client (:func:`read_relayed`), asks
another worker of the same model and role to go on from there (:func:`continuation_body`:
the prompt plus the text generated so far, ``max_tokens`` reduced by what was generated;
chat requests carry the partial answer as a final assistant message with
``continue_final_message: true, add_generation_prompt: false``, as vLLM and SGLang take
it), and rewrites the new stream's chunks (:class:`Resumed`) so that the client sees one
response: the first stream's ``id`` and ``created``, no second role chunk, and a usage
that adds up (prompt tokens as the client's prompt, completion tokens including those
carried over).

What cannot be continued exactly is not migrated (:func:`refusal`): several choices
(``n > 1``), log-probabilities, guided or structured decoding, a seed with sampling,
``echo``, tool calls already under way, and requests that opt out with the
``X-Infera-Migration: off`` header. They fail as before, with an error event.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("infera.server.migrate")

TOKEN_ID_ENGINES = frozenset({"vllm"})
"""Engines that stream the generated token ids when asked (vLLM's ``return_token_ids``): with
them a continuation is token-exact (the ids are replayed as a token prompt), where
re-tokenizing the text could split it differently."""

PROB_ID_ENGINES = frozenset({"llamacpp"})
"""Engines that stream the sampled token's id in their log-probability output when asked
(llama.cpp's ``n_probs: 1``) and take a mixed prompt (``[text, id, id, …]``, the text tokenized as
a prompt, the ids as they are): a sampled stream continues with the prompt's text plus the
generated ids. A greedy one (``temperature: 0``) is replayed whole instead, the part the client
has skipped (:class:`Resumed` ``skip``): the engine then decodes the same tokens the same way,
where ids re-read as a prompt are computed batched and can tip a near-tie. llama.cpp also holds
back a token whose bytes end in an unfinished UTF-8 character and reports no id for it; then the
ids are incomplete (:attr:`Relayed.ids_lost`) and the text is re-sent."""

MIGRATION_HEADER = "x-infera-migration"
"""``X-Infera-Migration: off`` on a request: never migrate it."""
OFF = frozenset({"off", "0", "false", "no", "none"})

_GUIDED = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "structured_outputs",
    "json_schema",
    "regex",
    "ebnf",
)


class IdsAdded(dict[str, Any]):
    """A request body to which the router added ``return_token_ids: true`` (or llama.cpp's
    ``n_probs: 1``): the ids are stripped from what the client receives (:func:`strip_ids`)."""


_IDS_FIELD = re.compile(rb',\s*"(?:prompt_)?token_ids"\s*:\s*(?:\[[^\]]*\]|null)')
_ASK_IDS = b'"return_token_ids":true,'


_ASK_PROBS = b'"n_probs":1,'
_PROBS = b'"logprobs":{"content":'


def asking_ids(raw: bytes, body: dict[str, Any], probs: bool = False) -> tuple[bytes, IdsAdded]:
    """``raw`` and ``body`` with ``return_token_ids: true`` (``probs``: llama.cpp's ``n_probs: 1``),
    spliced in after the opening brace."""
    i = raw.find(b"{")
    ask, field = (_ASK_PROBS, {"n_probs": 1}) if probs else (_ASK_IDS, {"return_token_ids": True})
    return raw[: i + 1] + ask + raw[i + 1 :], IdsAdded({**body, **field})


def strip_ids(chunk: bytes) -> bytes:
    """SSE bytes without the ``token_ids`` / ``prompt_token_ids`` fields (or the ``logprobs``
    of llama.cpp's ``n_probs``) the router asked for."""
    if b"token_ids" in chunk:
        chunk = _IDS_FIELD.sub(b"", chunk)
    if _PROBS in chunk:
        chunk = b"\n\n".join(_strip_probs(ev) if _PROBS in ev else ev for ev in chunk.split(b"\n\n"))
    return chunk


def _strip_probs(ev: bytes) -> bytes:
    """One SSE event without its choices' ``logprobs`` (chat: removed; completions: null, as
    llama.cpp sends it unasked)."""
    if not ev.startswith(b"data:"):
        return ev
    try:
        obj = json.loads(ev[5:])
    except ValueError:
        return ev
    if not isinstance(obj, dict):
        return ev
    chat = obj.get("object") == "chat.completion.chunk"
    for choice in obj.get("choices") or []:
        if isinstance(choice, dict) and "logprobs" in choice:
            if chat:
                del choice["logprobs"]
            else:
                choice["logprobs"] = None
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def refusal(body: dict[str, Any], headers: Any, chat: bool) -> str | None:
    """Why this request is not migrated if its stream breaks (None: it is)."""
    opt = headers.get(MIGRATION_HEADER) if headers is not None else None
    if isinstance(opt, str) and opt.strip().lower() in OFF:
        return f"the request opted out ({MIGRATION_HEADER}: {opt.strip()})"
    n = body.get("n")
    if (isinstance(n, int) and n > 1) or (isinstance(body.get("best_of"), int) and body["best_of"] > 1):
        return "n > 1: several choices cannot be continued as one"
    if body.get("logprobs") or body.get("top_logprobs"):
        return "logprobs were requested: the continued part's log-probabilities would not match"
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        return "structured output (response_format) cannot resume mid-document"
    for name in _GUIDED:
        if body.get(name) is not None:
            return f"guided decoding ({name}) cannot resume mid-document"
    if body.get("seed") is not None and not greedy(body):
        return "a seed with sampling: the continuation could not reproduce the seeded sequence"
    if not chat and body.get("echo"):
        return "echo: the prompt is part of the answer"
    return None


def greedy(body: dict[str, Any]) -> bool:
    """``temperature: 0``: the engine picks the likeliest token each time."""
    temperature = body.get("temperature")
    return isinstance(temperature, (int, float)) and temperature == 0


@dataclass(slots=True)
class Relayed:
    """What the client has received of a stream (choice 0)."""

    id: Any = None
    created: Any = None
    text: list[str] = field(default_factory=list)
    token_ids: list[int] | None = None
    """Generated token ids when every chunk carried them (vLLM ``return_token_ids``)."""
    prompt_token_ids: list[int] | None = None
    ids_lost: bool = False
    """The engine left tokens out of its ids (llama.cpp: a token ending in an unfinished UTF-8
    character): :attr:`token_ids` is None, and only a greedy replay can be exact."""
    events: int = 0
    """Chunks that carried generated text or token ids (one token each, without ids)."""
    finish: str | None = None
    tools: bool = False
    role_sent: bool = False
    done: bool = False

    @property
    def generated(self) -> int:
        return len(self.token_ids) if self.token_ids is not None else self.events


def read_relayed(data: bytes, chat: bool) -> Relayed:
    """Parse the SSE bytes relayed so far (whole events only)."""
    r = Relayed()
    ids: list[int] | None = []
    pieces: bytearray | None = None  # the ids' bytes (llama.cpp's logprobs), to check none is missing
    for line in data.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            r.done = True
            continue
        try:
            obj = json.loads(payload)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if r.id is None and obj.get("id") is not None:
            r.id, r.created = obj.get("id"), obj.get("created")
        if isinstance(obj.get("prompt_token_ids"), list):
            r.prompt_token_ids = obj["prompt_token_ids"]
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if not chat and isinstance(choice.get("prompt_token_ids"), list):
                r.prompt_token_ids = choice["prompt_token_ids"]
            if chat:
                delta = choice.get("delta") or {}
                if delta.get("role"):
                    r.role_sent = True
                if delta.get("tool_calls") or delta.get("function_call"):
                    r.tools = True
                text = delta.get("content")
            else:
                text = choice.get("text")
            got = choice.get("token_ids")
            probs = choice.get("logprobs")
            if got is None and isinstance(probs, dict) and isinstance(probs.get("content"), list):
                got = [p.get("id") for p in probs["content"] if isinstance(p, dict)]
                if pieces is None:
                    pieces = bytearray()
                for p in probs["content"]:
                    if isinstance(p, dict) and isinstance(p.get("bytes"), list):
                        pieces.extend(p["bytes"])
            if isinstance(got, list):
                if ids is not None:
                    ids.extend(got)
            elif text and ids is not None:
                ids = None  # text without ids: the ids are not known
            if text:
                r.text.append(text)
            if text or got:
                r.events += 1
            if choice.get("finish_reason"):
                r.finish = choice["finish_reason"]
    r.token_ids = ids if ids else None
    if (
        r.token_ids is not None
        and pieces is not None
        and bytes(pieces).decode("utf-8", "replace") != "".join(r.text)
    ):
        r.token_ids, r.ids_lost = None, True
    return r


def continuation_body(
    body: dict[str, Any], r: Relayed, chat: bool, prompt_text: str | None = None, mixed: bool = False
) -> dict[str, Any] | str:
    """The request that goes on from ``r`` on another worker, or why there is none.
    ``mixed``: the engine takes a mixed prompt (``[text, id, …]``, :data:`PROB_ID_ENGINES`);
    ``prompt_text``: a chat's prompt as the engine's template renders it (for a mixed prompt)."""
    out = dict(body)
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    limit = body.get(key)
    done = r.generated
    if isinstance(limit, int):
        if limit - done < 1:
            return "nothing is left to generate"
        out[key] = limit - done
    if isinstance(body.get("min_tokens"), int):
        out["min_tokens"] = max(0, body["min_tokens"] - done)
    text = "".join(r.text)
    if chat and r.token_ids is not None and (r.prompt_token_ids is not None or prompt_text is not None):
        # token-exact: the conversation as the engine tokenized it (or its rendered text, which
        # the engine tokenizes the same way), then what it generated, continued as a completion
        # (its chunks are turned back into chat chunks)
        out = {k: v for k, v in out.items() if k not in _CHAT_ONLY}
        out["max_tokens"] = out.pop("max_completion_tokens", out.get("max_tokens"))
        if out["max_tokens"] is None:
            del out["max_tokens"]
        head: list[Any] = list(r.prompt_token_ids) if r.prompt_token_ids is not None else [prompt_text]
        out["prompt"] = [*head, *r.token_ids]
        return out
    if chat:
        messages = list(body.get("messages") or [])
        last = messages[-1] if messages else None
        if body.get("continue_final_message") and isinstance(last, dict):
            content = last.get("content")
            if not isinstance(content, str):
                return "the final message being continued is not plain text"
            messages[-1] = {**last, "content": content + text}
        else:
            messages.append({"role": "assistant", "content": text})
        out["messages"] = messages
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
        return out
    prompt = body.get("prompt")
    if isinstance(prompt, str) and mixed and r.token_ids is not None:
        out["prompt"] = [prompt, *r.token_ids]  # the same text, tokenized as before, then the ids
    elif isinstance(prompt, str):
        out["prompt"] = prompt + text
    elif isinstance(prompt, list) and _ids(prompt) and r.token_ids is not None:
        out["prompt"] = [*prompt, *r.token_ids]
    elif r.prompt_token_ids is not None and r.token_ids is not None:
        out["prompt"] = [*r.prompt_token_ids, *r.token_ids]
    else:
        return "the prompt is neither a string nor token ids the generated ids can follow"
    return out


_CHAT_ONLY = frozenset(
    {
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "functions",
        "function_call",
        "chat_template",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "documents",
        "reasoning_effort",
        "include_reasoning",
        "mm_processor_kwargs",
        "modalities",
        "audio",
    }
)


def _ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


class Resumed:
    """Rewrites the continuation's SSE chunks into the first stream's: feed bytes, get bytes."""

    __slots__ = ("_buf", "as_chat", "carried", "chat", "created", "id", "skip", "skip_role")

    def __init__(self, r: Relayed, chat: bool, as_chat: bool = False, replay: bool = False) -> None:
        self.id = r.id
        self.created = r.created
        self.carried = 0 if replay else r.generated
        self.skip = "".join(r.text) if replay else ""
        """A replay (the whole request again, greedy): the text the client has, dropped from
        the continuation's start."""
        self.chat = chat
        self.as_chat = as_chat
        """The continuation is a completion standing in for a chat: turn its chunks into chat chunks."""
        self.skip_role = r.role_sent
        self._buf = b""

    def feed(self, chunk: bytes) -> bytes:
        self._buf += chunk
        *events, self._buf = self._buf.split(b"\n\n")
        out = []
        for ev in events:
            got = self._event(ev)
            if got:
                out.append(got + b"\n\n")
        return b"".join(out)

    def _event(self, ev: bytes) -> bytes:
        if not ev.startswith(b"data:"):
            return ev
        payload = ev[5:].strip()
        if payload == b"[DONE]":
            return ev
        try:
            obj = json.loads(payload)
        except ValueError:
            return ev
        if not isinstance(obj, dict) or "error" in obj:
            return ev
        if self.id is not None:
            obj["id"] = self.id
        if self.created is not None:
            obj["created"] = self.created
        obj.pop("prompt_token_ids", None)
        if self.as_chat:
            _as_chat_chunk(obj)
        choices = obj.get("choices") or []
        for choice in choices:
            if isinstance(choice, dict):
                choice.pop("prompt_token_ids", None)
        if self.skip and not self._skipped(choices) and obj.get("usage") is None:
            return b""  # all of it the client already has
        if self.chat and self.skip_role and _role_only(choices) and obj.get("usage") is None:
            self.skip_role = False
            return b""  # the client already has the assistant's opening chunk
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            carried = min(self.carried, usage["prompt_tokens"])
            usage["prompt_tokens"] -= carried
            usage["completion_tokens"] = int(usage.get("completion_tokens") or 0) + carried
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                details["cached_tokens"] = min(details["cached_tokens"], usage["prompt_tokens"])
        return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b""

    def _skipped(self, choices: list[Any]) -> bool:
        """Drop from choice 0 what the client has (:attr:`skip`); whether anything is left."""
        left = False
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            holder = choice.get("delta") if self.chat and not self.as_chat else choice
            key = "content" if holder is not choice else "text"
            text = holder.get(key) if isinstance(holder, dict) else None
            if isinstance(text, str) and text and self.skip:
                n = min(len(text), len(self.skip))
                if text[:n] != self.skip[:n]:  # the replay diverged: relay the rest as it comes
                    log.warning("a replayed continuation diverged from what the client has")
                    self.skip = ""
                else:
                    self.skip = self.skip[n:]
                    holder[key] = text = text[n:]  # type: ignore[index]
            if text or choice.get("finish_reason") or (holder is not choice and _has_more(holder)):
                left = True
        return left


def _has_more(delta: Any) -> bool:
    return isinstance(delta, dict) and any(k not in ("content", "role") and v for k, v in delta.items())


def _as_chat_chunk(obj: dict[str, Any]) -> None:
    """A ``text_completion`` chunk made a ``chat.completion.chunk`` (in place)."""
    obj["object"] = "chat.completion.chunk"
    for choice in obj.get("choices") or []:
        if isinstance(choice, dict):
            text = choice.pop("text", None)
            choice.pop("prompt_token_ids", None)
            if choice.get("logprobs") is None:
                choice.pop("logprobs", None)  # a completion's null; a chat chunk has none
            choice["delta"] = {"content": text} if text else {}


def _role_only(choices: list[Any]) -> bool:
    if not choices:
        return False
    for c in choices:
        if not isinstance(c, dict) or c.get("finish_reason"):
            return False
        delta = c.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls") or not delta.get("role"):
            return False
    return True


def whole_events(pending: bytes, chunk: bytes) -> tuple[bytes, bytes]:
    """``(whole events, the rest)`` of ``pending + chunk``: a migratable stream sends the client
    whole SSE events only, so that a continuation never lands inside a half-sent one."""
    data = pending + chunk if pending else chunk
    cut = data.rfind(b"\n\n") + 2
    if cut <= 1:
        return b"", data
    if cut == len(data):
        return data, b""
    return data[:cut], data[cut:]

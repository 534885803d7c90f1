"""OpenAI request parsing and response shapes, the way vLLM's server does them."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from infera_sim.config import SimConfig
from infera_sim.request import SimRequest
from infera_sim.tokenizer import EngineTokenizer


class ApiError(Exception):
    """Answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, type: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type or {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.status)


def error_body(message: str, type: str, param: str | None, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass(slots=True)
class Parsed:
    """A validated request: one token list per prompt plus the sampling knobs."""

    prompts: list[list[int]]
    max_tokens: int
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    seed: int = 0
    tool_call: dict[str, Any] | None = None
    """The function a forced ``tool_choice`` makes the sim call (name and parameters)."""
    cache_salt: str | None = None
    """vLLM's ``cache_salt``: folded into the first block's hash, so only requests with the same
    salt share cached blocks (the KV events carry it in ``extra_keys``, as vLLM's do)."""
    lora: tuple[str, int] | None = None
    """The LoRA adapter the request names (its name and vLLM's ``lora_int_id``); None: the base."""
    return_token_ids: bool = False
    """vLLM's ``return_token_ids``: streamed chunks carry ``token_ids`` (and the first one the
    ``prompt_token_ids``)."""
    priority: int = 0
    """vLLM's ``priority`` (lower first; only with ``--scheduling-policy priority``)."""
    prompt_logprobs: int | None = None
    """vLLM's ``prompt_logprobs``: per prompt token, this many alternatives (the answer grows by
    one entry per prompt token, placed where vLLM places it)."""

    def make_requests(self, request_id: str) -> list[SimRequest]:
        return [
            SimRequest(
                f"{request_id}-{i}" if len(self.prompts) > 1 else request_id,
                prompt,
                self.max_tokens,
                n=self.n,
                seed=self.seed,
                min_tokens=self.min_tokens,
                ignore_eos=self.ignore_eos,
                stop=self.stop,
                stop_token_ids=self.stop_token_ids,
                cache_salt=self.cache_salt,
                lora=self.lora,
                priority=self.priority,
            )
            for i, prompt in enumerate(self.prompts)
        ]


def _int(body: dict[str, Any], name: str, default: int | None, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(f"{name} must be an integer, got {value!r}", name)
    if value < low:
        raise ApiError(f"{name} must be at least {low}, got {value}", name)
    return value


def check_model(body: dict[str, Any], served: str, lora: Sequence[str] = ()) -> tuple[str, int] | None:
    """The LoRA adapter ``body`` names (name, vLLM's 1-based ``lora_int_id``), None for the
    served model; a 404 for any other name."""
    model = body.get("model")
    if model is None or model == served:
        return None
    if isinstance(model, str) and model in lora:
        return model, list(lora).index(model) + 1
    raise ApiError(f"The model `{model}` does not exist.", "model", 404)


def _prompts(body: dict[str, Any], tok: EngineTokenizer) -> list[list[int]]:
    prompt = body.get("prompt")
    if prompt is None:
        raise ApiError("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    if isinstance(prompt, str):
        return [tok.encode(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [tok.encode(p) for p in prompt]
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompt):
            return [list(p) for p in prompt]
    raise ApiError(
        "prompt must be a string, a list of strings, or a list of token ids (or lists of them)", "prompt"
    )


def _messages(body: dict[str, Any], tok: EngineTokenizer) -> list[list[int]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(f"messages[{i}] must be an object with a 'role'", "messages")
    if body.get("continue_final_message") and body.get("add_generation_prompt", True):
        raise ApiError(  # vLLM's own check
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "continue_final_message",
        )
    return [tok.encode_chat(messages, body)]


def _tool_call(body: dict[str, Any]) -> dict[str, Any] | None:
    tools = body.get("tools")
    if not tools:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ApiError("tools must be a list of objects", "tools")
    functions = [t.get("function") or {} for t in tools]
    choice = body.get("tool_choice")
    if choice == "required":
        return dict(functions[0])
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        for fn in functions:
            if fn.get("name") == name:
                return dict(fn)
        raise ApiError(f"tool_choice names function {name!r}, which is not in tools", "tool_choice")
    return None


def parse(body: dict[str, Any], tok: EngineTokenizer, cfg: SimConfig, chat: bool) -> Parsed:
    """Validate ``body`` and tokenize its prompt(s); raises :class:`ApiError`."""
    lora = check_model(body, cfg.model, list(cfg.lora_modules))
    prompts = _messages(body, tok) if chat else _prompts(body, tok)
    longest = max(len(p) for p in prompts)
    param = "messages" if chat else "prompt"
    if longest >= cfg.max_model_len:
        raise ApiError(
            f"This model's maximum context length is {cfg.max_model_len} tokens. However, your request has "
            f"{longest} input tokens. Please reduce the length of the input {param}.",
            param,
        )
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, name, None, 1)
    room = cfg.max_model_len - longest
    if max_tokens is None:
        max_tokens = min(cfg.default_max_tokens, room)
    elif max_tokens > room:
        raise ApiError(
            f"'{name}' is too large: {max_tokens}. This model's maximum context length is {cfg.max_model_len} "
            f"tokens and your request has {longest} input tokens ({max_tokens} > {cfg.max_model_len} - {longest}).",
            name,
        )
    n = _int(body, "n", 1, 1) or 1
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApiError("stop must be a string or a list of strings", "stop")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise ApiError("stream_options must be an object", "stream_options")
    stream = bool(body.get("stream", False))
    if stream_options and not stream:
        raise ApiError("Stream options can only be defined when `stream=True`.", "stream_options")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) for t in stop_ids):
        raise ApiError("stop_token_ids must be a list of integers", "stop_token_ids")
    seed = _int(body, "seed", 0, -(2**63)) or 0
    prompt_logprobs = _int(body, "prompt_logprobs", None, 0)
    if prompt_logprobs is not None and stream:
        raise ApiError("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
    return Parsed(
        prompts=prompts,
        max_tokens=max_tokens,
        n=n,
        stream=stream,
        include_usage=bool(stream_options.get("include_usage", False)),
        stop=stop,
        stop_token_ids=stop_ids,
        ignore_eos=bool(body.get("ignore_eos", False)),
        min_tokens=_int(body, "min_tokens", 0, 0) or 0,
        seed=seed,
        tool_call=_tool_call(body) if chat else None,
        prompt_logprobs=prompt_logprobs,
        cache_salt=_cache_salt(body),
        priority=_priority(body, cfg.scheduling_policy),
        lora=lora,
        return_token_ids=bool(body.get("return_token_ids")),
    )


def _priority(body: dict[str, Any], policy: str) -> int:
    """vLLM's ``priority``: an integer; a non-zero one without ``--scheduling-policy priority``
    is refused, with the message vLLM's processor gave (the router must send it only to workers
    that schedule by priority)."""
    value = _int(body, "priority", 0, -(2**63)) or 0
    if value and policy != "priority":
        raise ApiError(f"Got priority {value} but Priority scheduling is not enabled.", "priority")
    return value


def _cache_salt(body: dict[str, Any]) -> str | None:
    """vLLM's ``validate_cache_salt``: a non-empty string of at most 128 characters without
    ``@``, ``/``, ``\\`` or NUL."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise ApiError("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
    if len(salt) > 128 or any(c in salt for c in "@/\\\0"):
        raise ApiError(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL.",
            "cache_salt",
        )
    return salt


def usage(reqs: list[SimRequest]) -> dict[str, Any]:
    prompt = sum(len(r.prompt) for r in reqs)
    completion = sum(len(c.tokens) for r in reqs for c in r.choices)
    cached = sum(r.num_cached for r in reqs)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def tool_calls(fn: dict[str, Any], request_id: str) -> list[dict[str, Any]]:
    """A deterministic call of ``fn``: every declared parameter set to a placeholder."""
    props = ((fn.get("parameters") or {}).get("properties") or {}) if isinstance(fn, dict) else {}
    placeholder = {"integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}}
    args = {k: placeholder.get(str((v or {}).get("type")), "sim") for k, v in props.items()}
    return [
        {
            "id": f"chatcmpl-tool-{request_id[-12:]}",
            "type": "function",
            "function": {"name": fn.get("name", ""), "arguments": json.dumps(args)},
        }
    ]


def prompt_logprobs(prompt: list[int], decode: Callable[[int], str]) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs`` of ``prompt``: ``None`` for the first token, then per token
    ``{"<id>": {"logprob", "rank", "decoded_token"}}`` (deterministic values)."""
    out: list[dict[str, Any] | None] = [None]
    for i, tid in enumerate(prompt[1:]):
        out.append({str(tid): {"logprob": -0.25 - (i % 7) / 8, "rank": 1, "decoded_token": decode(tid)}})
    return out


def completion_body(rid: str, created: int, model: str, reqs: list[SimRequest]) -> dict[str, Any]:
    choices = []
    n = len(reqs[0].choices)
    for pi, r in enumerate(reqs):
        for ci, ch in enumerate(r.choices):
            choices.append(
                {
                    "index": pi * n + ci,
                    "text": ch.text,
                    "logprobs": None,
                    "finish_reason": ch.finish_reason,
                    "stop_reason": None,
                    "prompt_logprobs": None,
                }
            )
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(reqs),
        "system_fingerprint": None,
    }


def chat_body(
    rid: str, created: int, model: str, r: SimRequest, tool: dict[str, Any] | None
) -> dict[str, Any]:
    choices = []
    for ci, ch in enumerate(r.choices):
        message: dict[str, Any] = {"role": "assistant", "content": ch.text, "refusal": None, "tool_calls": []}
        finish = ch.finish_reason
        if tool is not None:
            message["content"] = None
            message["tool_calls"] = tool_calls(tool, rid)
            finish = "tool_calls"
        choices.append(
            {"index": ci, "message": message, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        )
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage([r]),
        "prompt_logprobs": None,
    }

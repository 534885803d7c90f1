"""How many tokens a request may cost at most: what admission reserves against a key's budget.

A key's ``tokens_per_day`` is checked *before* a request runs, against the most the request
can cost: ``prompt + max_tokens × n`` (× the number of prompts of a batched completion).

* prompt — the routing tokenizer's count when the request already carries token ids, else an
  upper estimate from bytes: every token of a byte-level BPE covers at least one byte, so the
  UTF-8 length of the text fields (plus a few tokens per chat message for the template) is
  never below the real count;
* output — ``max_completion_tokens`` / ``max_tokens`` as given, else the server's
  ``--budget-max-tokens`` (what an engine may generate when the request names no limit).

The reservation is settled to the engine's usage report when the request ends
(:class:`Charge`), or to what the router counted when there is none.
"""

from __future__ import annotations

from typing import Any

MESSAGE_OVERHEAD = 8
"""Tokens a chat template adds per message (role markers, separators), counted generously."""
REQUEST_OVERHEAD = 8
"""Tokens a chat template adds once (the generation prompt, BOS)."""


def _text_bytes(value: Any) -> int:
    """UTF-8 bytes of the strings in ``value`` (a string, or lists/objects of them), ints as one
    token each (token-id prompts)."""
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int | float):
        return 1
    if isinstance(value, list):
        return sum(_text_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_text_bytes(v) for v in value.values())
    return 0


def prompt_estimate(body: dict[str, Any], token_ids: list[int] | None = None) -> int:
    """An upper estimate of the prompt tokens of ``body`` (exact with ``token_ids``)."""
    if token_ids:
        return len(token_ids)
    messages = body.get("messages")
    if isinstance(messages, list):
        n = REQUEST_OVERHEAD + MESSAGE_OVERHEAD * len(messages) + _text_bytes(messages)
        for extra in ("tools", "functions", "response_format"):
            if extra in body:
                n += _text_bytes(body[extra])
        return n
    return _text_bytes(body.get("prompt")) + REQUEST_OVERHEAD


def _count(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def prompts_of(body: dict[str, Any]) -> int:
    """Prompts in one request: a completion's ``prompt`` may be a batch (strings or id lists)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1


def output_limit(body: dict[str, Any], default: int) -> int:
    """Output tokens the request may generate per sequence."""
    return _count(body, "max_completion_tokens") or _count(body, "max_tokens") or default


def sequences_of(body: dict[str, Any]) -> int:
    """Sequences generated per prompt: ``n`` (``best_of`` when larger: all of them are decoded)."""
    return max(_count(body, "n") or 1, _count(body, "best_of") or 1)


def reservation(body: dict[str, Any], default_max_tokens: int, token_ids: list[int] | None = None) -> int:
    """``prompt + max_tokens × n`` of ``body`` (per prompt of a batch)."""
    prompts = prompts_of(body)
    out = output_limit(body, default_max_tokens) * sequences_of(body) * prompts
    return prompt_estimate(body, token_ids) + out


class Charge:
    """One request's reservation against a key's daily budget, settled once at its end.

    ``day``/``tokens``: what :meth:`KeyRing.admit` reserved (``day`` -1: nothing, the key has
    no token budget); ``prompt``: the prompt estimate, charged when the engine's usage
    report never arrives; ``settled``: set by the first settlement, so a second one is a no-op.
    """

    __slots__ = ("day", "prompt", "settled", "tokens")

    def __init__(self, day: int, tokens: int, prompt: int) -> None:
        self.day = day
        self.tokens = tokens
        self.prompt = prompt
        self.settled = False

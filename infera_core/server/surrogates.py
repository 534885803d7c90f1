"""Lone UTF-16 surrogates in a JSON body (``"\\ud800"`` with no low half after it).

The escape is valid JSON grammar but no Unicode character: strict decoders refuse it
(msgspec, with a misleading "Input data was truncated"; pydantic-core: "unexpected end of
hex escape"), and one that lets it through hands the engine a string its tokenizer refuses:
real vLLM 0.32 answers such a body 400 "TextEncodeInput must be Union[TextInputSequence,
…]" (Hugging Face ``tokenizers``; ``plugins/infera-vllm/tests/test_real_vllm_surrogates.py``).
The router does what Go's ``encoding/json`` and a browser's ``TextEncoder`` do: each
lone surrogate becomes U+FFFD, the replacement character, and the body forwarded is valid
JSON every engine accepts. Pairs (``"\\ud83d\\ude00"``) and escaped backslashes stay as sent.
"""

from __future__ import annotations

import re

from infera_core.server.errors import ApiError

_ESCAPES = re.compile(
    rb"\\\\"  # an escaped backslash: what follows it is text, not an escape
    rb"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"  # a surrogate pair
    rb"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"  # a lone high or low surrogate
)
_REPLACEMENT = rb"\ufffd"


class LoneSurrogates(ApiError):
    """The body holds lone surrogate escapes; ``body`` is the same body with U+FFFD in their
    place. A 400 with a correct message wherever the repaired body is not used."""

    def __init__(self, body: bytes, count: int) -> None:
        super().__init__(
            400,
            f"The request body holds {count} lone UTF-16 surrogate escape(s) (such as \\ud800 with no"
            " low half): not Unicode characters. Send surrogates in pairs, or U+FFFD in their place.",
            code="invalid_json",
        )
        self.repaired = body


def without_lone_surrogates(raw: bytes) -> LoneSurrogates | None:
    """``raw`` with each lone surrogate escape replaced by ``\\ufffd`` (None when it has none)."""
    if b"\\u" not in raw and b"\\U" not in raw:
        return None
    count = 0

    def one(m: re.Match[bytes]) -> bytes:
        nonlocal count
        token = m.group()
        if len(token) == 6:
            count += 1
            return _REPLACEMENT
        return token

    out = _ESCAPES.sub(one, raw)
    return LoneSurrogates(out, count) if count else None

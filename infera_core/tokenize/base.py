"""The tokenizer contract used by the router to compute prompt block hashes."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from infera_core.registry import Registry


@runtime_checkable
class Tokenizer(Protocol):
    @property
    def fingerprint(self) -> str:
        """Identifies vocabulary + template; compared with workers' ``kv_events.fingerprint``."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of a completion prompt, exactly as the engine tokenizes it."""
        ...

    def encode_chat(self, messages: list[dict[str, Any]], body: dict[str, Any]) -> list[int]:
        """Token ids of a chat request, with the engine's chat template applied."""
        ...


@runtime_checkable
class PrefixTokenizer(Protocol):
    """A tokenizer whose chat prompts can be tokenized incrementally (``tokenize/incremental.py``).

    ``encode_chat(m, b)`` must equal ``encode_offsets(render_chat(m, b))[0]``.
    """

    def render_chat(self, messages: list[dict[str, Any]], body: dict[str, Any]) -> str:
        """The chat template applied to ``messages``: the text the engine tokenizes."""
        ...

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        """Ids and start character offsets of ``text``'s tokens, no special tokens added."""
        ...


@runtime_checkable
class TokenizerFactory(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    def create(self, model: str, options: dict[str, Any]) -> Tokenizer:
        """A tokenizer for ``model``; ``options`` come from router config (e.g. ``path``)."""
        ...


class TokenizerRegistry(Registry[TokenizerFactory]):
    kind = "tokenizer"
    protocol = TokenizerFactory

"""Hugging Face tokenizers for routing: ``tokenizer.json`` + the model's chat templates.

Chat requests are rendered as vLLM 0.32 renders them (:mod:`infera_core.tokenize.chat`:
the templates from ``chat_template.jinja``, ``additional_chat_templates/``,
``chat_template.json`` or ``tokenizer_config.json``, chosen per request, in transformers'
sandboxed jinja2 environment, with vLLM's message and tool normalization), then encoded
without adding special tokens (the template writes them) unless the request sets
``add_special_tokens``. Completion prompts are encoded with the tokenizer's post-processor
(BOS), as the engine does.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from infera_core.errors import ConfigError
from infera_core.tokenize.chat import render_chat
from infera_core.tokenize.chat_templates import ChatTemplates

_OFFSETS_AT_ONCE = 8192
"""Encodings up to this many tokens give their offsets in one call (a few ms at most)."""
_NO_SPAN = (0, 0)


class HfTokenizer:
    """A ``tokenizer.json`` (and optional ``tokenizer_config.json``) from a model directory."""

    __slots__ = ("_config", "_fingerprint", "_templates", "_tok")

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as _Tok

        p = Path(path)
        file = p / "tokenizer.json" if p.is_dir() else p
        if not file.is_file():
            raise ConfigError(f"--tokenizer: no tokenizer.json at {path}")
        raw = file.read_bytes()
        try:
            self._tok = _Tok.from_str(raw.decode())
        except Exception as exc:
            raise ConfigError(f"--tokenizer: {file} is not a valid tokenizer.json ({exc})") from None
        self._config: dict[str, Any] = {}
        cfg_file = file.with_name("tokenizer_config.json")
        if cfg_file.is_file():
            try:
                loaded = json.loads(cfg_file.read_text())
            except ValueError as exc:
                raise ConfigError(f"--tokenizer: {cfg_file} is not valid JSON ({exc})") from None
            if isinstance(loaded, dict):
                self._config = loaded
        self._fingerprint = "hf:" + hashlib.sha256(raw).hexdigest()[:16]
        try:
            self._templates = ChatTemplates(str(file.parent), self._config, file.parent)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--tokenizer: {exc}") from None
        sources = self._templates.sources
        if sources:
            self._fingerprint += ":" + hashlib.sha256("\0".join(sources).encode()).hexdigest()[:8]

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def _encode(self, text: str, add_special_tokens: bool) -> Any:
        # encode_batch, not encode: only the batch call releases the GIL (tokenizers'
        # Python binding), so a long prompt tokenized in a thread leaves the event loop free.
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0]

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text, True).ids)

    def render_chat(self, messages: list[dict[str, Any]], body: dict[str, Any]) -> str:
        return render_chat(self._templates, messages, body)

    def encode_chat(self, messages: list[dict[str, Any]], body: dict[str, Any]) -> list[int]:
        text = self.render_chat(messages, body)
        return list(self._encode(text, bool(body.get("add_special_tokens", False))).ids)

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        """Ids and start character offsets of ``text``'s tokens, no special tokens added."""
        enc = self._encode(text, False)
        ids = list(enc.ids)
        if len(ids) <= _OFFSETS_AT_ONCE:
            return ids, [start for start, _ in enc.offsets]
        # ``enc.offsets`` builds its list of tuples holding the GIL (~100 ms for 250k tokens:
        # the event loop stalls though this runs in a thread); one token at a time, the
        # interpreter hands the GIL back between calls, and it is no slower.
        span = enc.token_to_chars
        return ids, [(span(i) or _NO_SPAN)[0] for i in range(len(ids))]


class HfTokenizerFactory:
    """Tokenizer ``hf``: option ``path`` = a model directory or a ``tokenizer.json``."""

    name = "hf"
    description = (
        "Hugging Face tokenizer.json + the model's chat templates, rendered as vLLM does (option 'path')."
    )

    def create(self, model: str, options: dict[str, Any]) -> HfTokenizer:
        path = options.get("path")
        if not path:
            raise ConfigError(f"--tokenizer {model}=hf needs a path: --tokenizer {model}=hf:/models/dir")
        return HfTokenizer(str(path))

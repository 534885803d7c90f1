"""Hugging Face tokenizers for routing: ``tokenizer.json`` + the chat template.

Renders chat requests the way vLLM/transformers do (``apply_chat_template``): the
``chat_template`` from ``tokenizer_config.json`` in a sandboxed jinja2 environment
with ``trim_blocks``/``lstrip_blocks``, ``bos_token``/``eos_token`` and the request's
``tools``/``documents``/``chat_template_kwargs`` in scope, then encoded without adding
special tokens (the template writes them). Completion prompts are encoded with the
tokenizer's post-processor (BOS), as the engine does.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from infera_core.errors import ConfigError


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _raise(message: str) -> None:
    raise ValueError(message)


class HfTokenizer:
    """A ``tokenizer.json`` (and optional ``tokenizer_config.json``) from a model directory."""

    __slots__ = ("_add_bos", "_config", "_fingerprint", "_template", "_tok")

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
        template = self._config.get("chat_template")
        if isinstance(template, list):  # named templates: take "default"
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        self._template: Any = None
        if isinstance(template, str):
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            self._template = env.from_string(template)
            self._fingerprint += ":" + hashlib.sha256(template.encode()).hexdigest()[:8]
        self._add_bos = self._config.get("add_bos_token")

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
        if self._template is None:
            raise ValueError("the model has no chat_template in tokenizer_config.json")
        kwargs: dict[str, Any] = {
            "bos_token": _token_text(self._config.get("bos_token")) or "",
            "eos_token": _token_text(self._config.get("eos_token")) or "",
            "pad_token": _token_text(self._config.get("pad_token")),
            "unk_token": _token_text(self._config.get("unk_token")),
        }
        for key in ("tools", "documents"):
            if body.get(key) is not None:
                kwargs[key] = body[key]
        extra = body.get("chat_template_kwargs")
        if isinstance(extra, dict):
            kwargs.update(extra)
        kwargs["messages"] = messages
        kwargs["add_generation_prompt"] = bool(
            body.get("add_generation_prompt", kwargs.get("add_generation_prompt", True))
        )
        return str(self._template.render(**kwargs))

    def encode_chat(self, messages: list[dict[str, Any]], body: dict[str, Any]) -> list[int]:
        text = self.render_chat(messages, body)
        return list(self._encode(text, False).ids)

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        """Ids and start character offsets of ``text``'s tokens, no special tokens added."""
        enc = self._encode(text, False)
        return list(enc.ids), [start for start, _ in enc.offsets]


class HfTokenizerFactory:
    """Tokenizer ``hf``: option ``path`` = a model directory or a ``tokenizer.json``."""

    name = "hf"
    description = "Hugging Face tokenizer.json + chat template from tokenizer_config.json (option 'path')."

    def create(self, model: str, options: dict[str, Any]) -> HfTokenizer:
        path = options.get("path")
        if not path:
            raise ConfigError(f"--tokenizer {model}=hf needs a path: --tokenizer {model}=hf:/models/dir")
        return HfTokenizer(str(path))

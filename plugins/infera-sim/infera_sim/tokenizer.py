"""Tokenizers shared by the sim engine and the router (so both compute the same token ids).

The built-in :class:`SimTokenizer` splits text into words, punctuation and whitespace
and maps each piece to a stable id through a fixed hash into the vocabulary (ids 0–3
are ``<unk> <s> </s> <pad>``). Chat requests are rendered with the recorded tiny
model's template (``<s>{role}\\n{content}</s>\\n`` … ``<s>assistant\\n``), whose
``<s>``/``</s>`` become the special ids. :class:`HfTokenizer` does the same with a
real ``tokenizer.json`` through the ``tokenizers`` library.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from infera_core.errors import ConfigError

UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3
N_SPECIAL = 4
BOS, EOS = "<s>", "</s>"
_SPECIAL_TEXT = ("<unk>", BOS, EOS, "<pad>")

_PIECE = re.compile(r" ?\w+| ?[^\w\s]|\s+")
_SPECIAL = re.compile(r"(<s>|</s>)")
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "gu", "he", "ju", "wi", "ya")
OUTPUT_WORDS = 512
"""How many distinct words the sim generates (each re-encodes to its own id)."""


def content_text(content: Any) -> str:
    """The text of a chat message ``content`` (a string or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content)
    return str(content)


def render_chat(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    """The tiny model's chat template, rendered without jinja (hot path)."""
    parts = [f"<s>{m.get('role', 'user')}\n{content_text(m.get('content'))}</s>\n" for m in messages]
    if add_generation_prompt:
        parts.append("<s>assistant\n")
    return "".join(parts)


class _PieceIds(dict[str, int]):
    """piece → id, computed once per distinct piece (a fixed hash into the vocabulary)."""

    __slots__ = ("pieces", "span")

    def __init__(self, span: int) -> None:
        super().__init__()
        self.span = span
        self.pieces: dict[int, str] = {}
        """id → the first piece seen with that id (``/detokenize``)."""

    def __missing__(self, piece: str) -> int:
        digest = hashlib.blake2b(piece.encode(), digest_size=8).digest()
        value = N_SPECIAL + int.from_bytes(digest, "little") % self.span
        if len(self) < 1_000_000:
            self[piece] = value
            self.pieces.setdefault(value, piece)
        return value


class SimTokenizer:
    """Deterministic built-in tokenizer: pieces → ids by a fixed hash (no files needed)."""

    __slots__ = ("_chunks", "_ids", "_words", "vocab_size")

    def __init__(self, vocab_size: int = 32000) -> None:
        if vocab_size < 64:
            raise ConfigError(f"--vocab-size must be at least 64, got {vocab_size}")
        self.vocab_size = vocab_size
        self._ids = _PieceIds(vocab_size - N_SPECIAL)
        self._chunks: dict[str, list[int]] = {}
        words: dict[int, str] = {}
        i = 0
        while len(words) < min(OUTPUT_WORDS, (vocab_size - N_SPECIAL) // 2):
            a, b, c = i % 16, (i // 16) % 16, (i // 256) % 16
            word = " " + _SYLLABLES[a] + _SYLLABLES[b] + (_SYLLABLES[c] if i >= 256 else "")
            words.setdefault(self._ids[word], word)
            i += 1
        self._words = words

    @property
    def fingerprint(self) -> str:
        return f"infera-sim-v1:vocab={self.vocab_size}"

    def _pieces(self, text: str) -> list[int]:
        if len(text) < 256:
            return list(map(self._ids.__getitem__, _PIECE.findall(text)))
        # long chunks (system prompts, shared documents) repeat across requests: remember them
        chunks = self._chunks
        ids = chunks.get(text)
        if ids is None:
            ids = list(map(self._ids.__getitem__, _PIECE.findall(text)))
            if len(chunks) >= 4096:
                chunks.clear()
            chunks[text] = ids
        return ids

    def _encode_with_specials(self, text: str) -> list[int]:
        ids: list[int] = []
        for chunk in _SPECIAL.split(text):
            if chunk == BOS:
                ids.append(BOS_ID)
            elif chunk == EOS:
                ids.append(EOS_ID)
            elif chunk:
                ids.extend(self._pieces(chunk))
        return ids

    def encode(self, text: str) -> list[int]:
        return [BOS_ID, *self._encode_with_specials(text)]

    def encode_chat(self, messages: list[dict[str, Any]], body: dict[str, Any]) -> list[int]:
        if body.get("continue_final_message") and messages:
            # vLLM's continue_final_message: the last message is left open (no ``</s>``, no
            # generation prompt) for the model to go on; its text is encoded on its own, so
            # an assistant's partial answer gives back the very ids that produced it
            *head, last = messages
            opened = render_chat(head, False) + f"<s>{last.get('role', 'user')}\n"
            return self._encode_with_specials(opened) + self._pieces(content_text(last.get("content")))
        add = bool(body.get("add_generation_prompt", True))
        return self._encode_with_specials(render_chat(messages, add))

    def output_vocab(self) -> list[int]:
        """Token ids the sim generates; each decodes to a word that re-encodes to itself."""
        return sorted(self._words)

    def decode_token(self, token_id: int) -> str:
        if token_id == EOS_ID:
            return ""
        return self._words.get(token_id, f" t{token_id}")

    def decode(self, ids: list[int]) -> str:
        """``/detokenize``: the text of ``ids`` (special tokens kept); ids never encoded here
        come back as `` t<id>``. Text from encoded ids re-encodes to the same ids."""
        pieces = self._ids.pieces
        special = _SPECIAL_TEXT
        return "".join(special[i] if i < N_SPECIAL else pieces.get(i, f" t{i}") for i in ids)


class HfTokenizer:
    """A real ``tokenizer.json`` (``tokenizers`` library) with the tiny model's chat template.

    If ``tokenizer_config.json`` sits next to the file and has a ``chat_template``, it is
    rendered with jinja2 instead.
    """

    __slots__ = ("_fingerprint", "_out", "_template", "_tok")

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer as _HfTok

        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"--tokenizer-json: no such file {path}")
        raw = file.read_bytes()
        try:
            self._tok = _HfTok.from_str(raw.decode())
        except Exception as exc:
            raise ConfigError(f"--tokenizer-json: {path} is not a tokenizer.json ({exc})") from None
        self._fingerprint = "hf:" + hashlib.sha256(raw).hexdigest()[:16]
        self._template: Any = None
        cfg_file = file.with_name("tokenizer_config.json")
        if cfg_file.is_file():
            template = json.loads(cfg_file.read_text()).get("chat_template")
            if isinstance(template, str):
                import jinja2

                self._template = jinja2.Environment().from_string(template)
                self._fingerprint += ":" + hashlib.sha256(template.encode()).hexdigest()[:8]
        vocab = self._tok.get_vocab_size()
        specials = {BOS_ID, EOS_ID, UNK_ID, PAD_ID}
        self._out = [i for i in range(N_SPECIAL, min(vocab, N_SPECIAL + OUTPUT_WORDS)) if i not in specials]

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def encode_chat(self, messages: list[dict[str, Any]], body: dict[str, Any]) -> list[int]:
        if body.get("continue_final_message") and messages:
            *head, last = messages
            opened = self.encode_chat(head, {"add_generation_prompt": True})
            return opened + list(
                self._tok.encode(content_text(last.get("content")), add_special_tokens=False).ids
            )
        add = bool(body.get("add_generation_prompt", True))
        if self._template is not None:
            text = self._template.render(messages=messages, add_generation_prompt=add)
        else:
            text = render_chat(messages, add)
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def output_vocab(self) -> list[int]:
        return self._out

    def decode_token(self, token_id: int) -> str:
        return str(self._tok.decode([token_id], skip_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=False))


EngineTokenizer = SimTokenizer | HfTokenizer


def make_tokenizer(tokenizer_json: str | None = None, vocab_size: int = 32000) -> EngineTokenizer:
    """The tokenizer a sim with these flags uses (the router builds it the same way)."""
    if tokenizer_json:
        return HfTokenizer(tokenizer_json)
    return SimTokenizer(vocab_size)


class SimTokenizerFactory:
    """Registered as tokenizer ``sim``; options: ``path`` (tokenizer.json), ``vocab_size``."""

    name = "sim"
    description = (
        "The sim engine's tokenizer (built-in hash tokenizer, or a tokenizer.json via option 'path')."
    )

    def create(self, model: str, options: dict[str, Any]) -> EngineTokenizer:
        path = options.get("path") or options.get("tokenizer_json")
        return make_tokenizer(str(path) if path else None, int(options.get("vocab_size", 32000)))

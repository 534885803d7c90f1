"""The model card: what a worker's launcher publishes so routers learn its model.

A card is one canonical JSON document (sorted keys, UTF-8) whose sha256 is its name::

    {"card_version": 1, "model": "llama", "served_names": ["llama", "llama-lora"],
     "source": "/models/llama", "block_size": 16, "hash": {"algo": "sha256", "seed": null},
     "max_model_len": 4096, "lora": ["llama-lora"], "engine": "vllm",
     "files": {"tokenizer.json": "...", "tokenizer_config.json": "...",
               "chat_template.jinja": "...", "additional_chat_templates/tool_use.jinja": "..."}}

``files`` holds the tokenizer files the engine reads (:data:`CARD_FILES`, and every
``additional_chat_templates/*.jinja``), as text. A router writes them to a directory and
builds the same tokenizer ``--tokenizer MODEL=hf:<that directory>`` builds.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CARD_VERSION = 1
CARD_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "generation_config.json",
)
TEMPLATES_DIR = "additional_chat_templates"


class CardError(ValueError):
    """A card that cannot be used (digest mismatch, too big, malformed)."""


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def card_files(directory: Path) -> dict[str, str]:
    """The tokenizer files of a model directory (those present), as text."""
    out: dict[str, str] = {}
    for name in CARD_FILES:
        f = directory / name
        if f.is_file():
            out[name] = f.read_text(encoding="utf-8")
    extra = directory / TEMPLATES_DIR
    if extra.is_dir():
        for f in sorted(extra.glob("*.jinja")):
            if f.is_file():
                out[f"{TEMPLATES_DIR}/{f.name}"] = f.read_text(encoding="utf-8")
    return out


@dataclass
class ModelCard:
    """The card's fields (see the module docstring)."""

    model: str
    files: dict[str, str]
    served_names: list[str] = field(default_factory=list)
    source: str = ""
    engine: str = ""
    block_size: int | None = None
    hash: dict[str, Any] = field(default_factory=dict)
    max_model_len: int | None = None
    lora: list[str] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        doc = {
            "card_version": CARD_VERSION,
            "model": self.model,
            "served_names": self.served_names,
            "source": self.source,
            "engine": self.engine,
            "block_size": self.block_size,
            "hash": self.hash,
            "max_model_len": self.max_model_len,
            "lora": self.lora,
            "files": self.files,
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def from_bytes(cls, data: bytes, digest: str | None = None) -> ModelCard:
        """Parse (and, with ``digest``, verify) a card; :class:`CardError` when unusable."""
        if digest is not None and digest_of(data) != digest:
            raise CardError(f"model card digest mismatch: wanted {digest}, got {digest_of(data)}")
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise CardError(f"model card is not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("card_version") != CARD_VERSION:
            raise CardError(
                f"model card version {doc.get('card_version') if isinstance(doc, dict) else None!r} "
                f"is not {CARD_VERSION}"
            )
        files = doc.get("files")
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()
        ):
            raise CardError("model card: 'files' must map names to text")
        for name in files:
            if not _safe_name(name):
                raise CardError(f"model card: unsafe file name {name!r}")
        hash_ = doc.get("hash")
        return cls(
            model=str(doc.get("model", "")),
            files=files,
            served_names=[str(n) for n in doc.get("served_names") or []],
            source=str(doc.get("source") or ""),
            engine=str(doc.get("engine") or ""),
            block_size=doc.get("block_size") if isinstance(doc.get("block_size"), int) else None,
            hash=hash_ if isinstance(hash_, dict) else {},
            max_model_len=doc.get("max_model_len") if isinstance(doc.get("max_model_len"), int) else None,
            lora=[str(n) for n in doc.get("lora") or []],
        )

    @property
    def has_tokenizer(self) -> bool:
        return "tokenizer.json" in self.files

    def write_files(self, directory: Path) -> None:
        """Write the tokenizer files under ``directory`` (created)."""
        for name, text in self.files.items():
            target = directory / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")


def _safe_name(name: str) -> bool:
    parts = name.split("/")
    if len(parts) == 1:
        return name in CARD_FILES
    return (
        len(parts) == 2
        and parts[0] == TEMPLATES_DIR
        and parts[1].endswith(".jinja")
        and parts[1] not in ("", ".", "..")
        and "\\" not in parts[1]
        and not parts[1].startswith(".")
    )

"""Which routing tokenizer serves a model: ``--tokenizer MODEL=NAME[:PATH]`` and what a worker
record says (its ``infera.tokenizer`` label, or the sim's fingerprint family)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from infera_core.errors import ConfigError
from infera_core.worker import WorkerRecord

TokenizerSpec = tuple[str, dict[str, Any]]
"""A routing tokenizer by name and options (``("hf", {"path": ...})``)."""

LABEL = "infera.tokenizer"
ENGINE = "engine"
"""``infera.tokenizer=engine``: ask the worker's own ``/tokenize`` (:mod:`.engine`)."""


def parse_spec(text: str) -> TokenizerSpec:
    """``NAME[:PATH]`` → (name, options)."""
    name, sep, path = text.partition(":")
    if not name:
        raise ValueError(f"empty tokenizer name in {text!r}")
    return name, ({"path": path} if sep and path else {})


def parse_model_specs(values: Iterable[str], flag: str = "--tokenizer") -> dict[str, TokenizerSpec]:
    """``MODEL=NAME[:PATH]`` flags → {model: spec}; a bad value raises :class:`ConfigError`."""
    out: dict[str, TokenizerSpec] = {}
    for v in values:
        model, sep, spec = v.partition("=")
        if not sep or not model or not spec:
            raise ConfigError(f"{flag} {v!r}: expected MODEL=NAME[:PATH], e.g. llama=hf:/models/llama")
        try:
            out[model] = parse_spec(spec)
        except ValueError as exc:
            raise ConfigError(f"{flag} {v!r}: {exc}") from None
    return out


def spec_from_record(record: WorkerRecord) -> TokenizerSpec | None:
    """The tokenizer a worker record names (label, or a known fingerprint family)."""
    label = record.labels.get(LABEL)
    if label:
        try:
            return parse_spec(label)
        except ValueError:
            return None
    fp = record.kv_events.fingerprint if record.kv_events else None
    if fp and fp.startswith("infera-sim-v1:"):
        opts: dict[str, Any] = {}
        for part in fp.split(":", 1)[1].split(","):
            k, _, v = part.partition("=")
            if k == "vocab" and v.isdigit():
                opts["vocab_size"] = int(v)
        return "sim", opts
    return None

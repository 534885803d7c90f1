"""Core's routing tokenizers: ``hf`` (tokenizer.json + chat template)."""

from __future__ import annotations

from infera_core.plugin.spec import hookimpl
from infera_core.tokenize.base import TokenizerRegistry


@hookimpl
def infera_register_tokenizers(registry: TokenizerRegistry) -> None:
    from infera_core.tokenize.hf import HfTokenizerFactory

    registry.add(HfTokenizerFactory())

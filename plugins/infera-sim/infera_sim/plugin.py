"""Hook implementations of the infera-sim plugin: the ``sim`` engine and tokenizer."""

from __future__ import annotations

from infera_core.engines.base import EngineRegistry
from infera_core.plugin.spec import hookimpl
from infera_core.tokenize.base import TokenizerRegistry
from infera_sim.adapter import SimAdapter
from infera_sim.tokenizer import SimTokenizerFactory


@hookimpl
def infera_register_engines(registry: EngineRegistry) -> None:
    registry.add(SimAdapter())


@hookimpl
def infera_register_tokenizers(registry: TokenizerRegistry) -> None:
    registry.add(SimTokenizerFactory())

"""Hook implementations of the infera-openai plugin."""

from __future__ import annotations

from infera_core.engines.base import EngineRegistry
from infera_core.engines.pd import PdProtocolRegistry
from infera_core.kv.events import KvDecoderRegistry
from infera_core.plugin.spec import hookimpl


@hookimpl
def infera_register_engines(registry: EngineRegistry) -> None:
    from infera_openai.generic import GenericOpenAIAdapter
    from infera_openai.llamacpp import LlamaCppAdapter
    from infera_openai.tgi import TgiAdapter
    from infera_openai.triton import TritonAdapter
    from infera_openai.trtllm import TrtllmAdapter

    for adapter in (
        LlamaCppAdapter(),
        TgiAdapter(),
        TrtllmAdapter(),
        TritonAdapter(),
        GenericOpenAIAdapter(),
    ):
        registry.add(adapter)


@hookimpl
def infera_register_kv_event_decoders(registry: KvDecoderRegistry) -> None:
    from infera_openai.trtllm_events import TrtllmEventDecoder

    registry.add(TrtllmEventDecoder())


@hookimpl
def infera_register_pd_transports(registry: PdProtocolRegistry) -> None:
    from infera_openai.trtllm_pd import TrtllmDisaggProtocol

    registry.add(TrtllmDisaggProtocol())

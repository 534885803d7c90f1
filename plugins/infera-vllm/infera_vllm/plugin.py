"""Hook implementations of the infera-vllm plugin."""

from __future__ import annotations

from infera_core.engines.base import EngineRegistry
from infera_core.engines.pd import PdTransportRegistry
from infera_core.engines.transfer import TransferConnectorRegistry
from infera_core.kv.events import KvDecoderRegistry
from infera_core.plugin.spec import hookimpl


@hookimpl
def infera_register_engines(registry: EngineRegistry) -> None:
    from infera_vllm.adapter import VllmAdapter

    registry.add(VllmAdapter())


@hookimpl
def infera_register_pd_transports(registry: PdTransportRegistry) -> None:
    from infera_vllm.pd import (
        VllmMooncakeTransport,
        VllmMoriioReadTransport,
        VllmMoriioTransport,
        VllmNixlTransport,
    )

    registry.add(VllmNixlTransport())
    registry.add(VllmMooncakeTransport())
    registry.add(VllmMoriioTransport())
    registry.add(VllmMoriioReadTransport())


@hookimpl
def infera_register_transfer_connectors(registry: TransferConnectorRegistry) -> None:
    from infera_vllm.transfer import BUILTIN

    for connector in BUILTIN:
        registry.add(connector)


@hookimpl
def infera_register_kv_event_decoders(registry: KvDecoderRegistry) -> None:
    from infera_vllm.kv_events import vllm_decoder

    registry.add(vllm_decoder())

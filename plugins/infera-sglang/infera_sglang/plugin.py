"""Hook implementations of the infera-sglang plugin."""

from __future__ import annotations

from infera_core.engines.base import EngineRegistry
from infera_core.engines.pd import PdTransportRegistry
from infera_core.engines.transfer import TransferConnectorRegistry
from infera_core.kv.events import KvDecoderRegistry
from infera_core.plugin.spec import hookimpl


@hookimpl
def infera_register_engines(registry: EngineRegistry) -> None:
    from infera_sglang.adapter import SglangAdapter

    registry.add(SglangAdapter())


@hookimpl
def infera_register_pd_transports(registry: PdTransportRegistry) -> None:
    from infera_sglang.pd import SglangBootstrapTransport

    registry.add(SglangBootstrapTransport())


@hookimpl
def infera_register_kv_event_decoders(registry: KvDecoderRegistry) -> None:
    from infera_sglang.kv_events import sglang_decoder

    registry.add(sglang_decoder())


@hookimpl
def infera_register_transfer_connectors(registry: TransferConnectorRegistry) -> None:
    from infera_sglang.transfer import BUILTIN

    for connector in BUILTIN:
        registry.add(connector)

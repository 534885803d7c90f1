"""Hook implementations of the infera-atom plugin."""

from __future__ import annotations

from infera_core.engines.base import EngineRegistry
from infera_core.engines.pd import PdTransportRegistry
from infera_core.engines.transfer import TransferConnectorRegistry
from infera_core.kv.events import KvDecoderRegistry
from infera_core.plugin.spec import hookimpl


@hookimpl
def infera_register_engines(registry: EngineRegistry) -> None:
    from infera_atom.adapter import AtomAdapter

    registry.add(AtomAdapter())


@hookimpl
def infera_register_pd_transports(registry: PdTransportRegistry) -> None:
    from infera_atom.pd import AtomMooncakeTransport, AtomMoriioTransport

    registry.add(AtomMooncakeTransport())
    registry.add(AtomMoriioTransport())


@hookimpl
def infera_register_transfer_connectors(registry: TransferConnectorRegistry) -> None:
    from infera_atom.transfer import BUILTIN

    for connector in BUILTIN:
        registry.add(connector)


@hookimpl
def infera_register_kv_event_decoders(registry: KvDecoderRegistry) -> None:
    from infera_atom.kv_events import AtomEventDecoder

    registry.add(AtomEventDecoder())

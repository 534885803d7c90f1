"""Hook implementations of the infera-atom plugin."""

from __future__ import annotations

from infera_core.hookspecs import hookimpl
from infera_core.registry import EngineRegistry, PdTransportRegistry


@hookimpl
def infera_register_engines(registry: EngineRegistry) -> None:
    from infera_atom.adapter import AtomAdapter

    registry.add(AtomAdapter())


@hookimpl
def infera_register_pd_transports(registry: PdTransportRegistry) -> None:
    from infera_atom.pd import AtomMooncakeTransport

    registry.add(AtomMooncakeTransport())

"""Hook implementations of the infera-sglang plugin."""

from __future__ import annotations

from infera_core.hookspecs import hookimpl
from infera_core.registry import EngineRegistry, PdTransportRegistry


@hookimpl
def infera_register_engines(registry: EngineRegistry) -> None:
    from infera_sglang.adapter import SglangAdapter

    registry.add(SglangAdapter())


@hookimpl
def infera_register_pd_transports(registry: PdTransportRegistry) -> None:
    from infera_sglang.pd import SglangBootstrapTransport

    registry.add(SglangBootstrapTransport())

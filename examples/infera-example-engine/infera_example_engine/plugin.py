from infera_core.engines.base import EngineRegistry
from infera_core.plugin.spec import hookimpl


@hookimpl
def infera_register_engines(registry: EngineRegistry) -> None:
    from infera_example_engine.adapter import EchoAdapter  # keep the plugin module light

    registry.add(EchoAdapter())

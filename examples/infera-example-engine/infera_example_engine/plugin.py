from infera_core.hookspecs import hookimpl
from infera_core.registry import EngineRegistry


@hookimpl
def infera_register_engines(registry: EngineRegistry) -> None:
    from infera_example_engine.adapter import EchoAdapter  # keep the plugin module light

    registry.add(EchoAdapter())

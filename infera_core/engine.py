"""Moved to :mod:`infera_core.engines.base`; this re-export stays for one release."""

from infera_core.engines.base import (
    OPTION_CLASH_HINT,
    EngineAdapter,
    EngineOption,
    EngineRegistry,
    FlagAlias,
    FlagAliases,
    HealthGenerate,
    LaunchContext,
    LaunchSpec,
    RecordFields,
    RunningEngine,
    ServedBlockSize,
    option_clashes,
)

__all__ = [
    "OPTION_CLASH_HINT",
    "EngineAdapter",
    "EngineOption",
    "EngineRegistry",
    "FlagAlias",
    "FlagAliases",
    "HealthGenerate",
    "LaunchContext",
    "LaunchSpec",
    "RecordFields",
    "RunningEngine",
    "ServedBlockSize",
    "option_clashes",
]

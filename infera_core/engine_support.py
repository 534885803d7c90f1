"""Moved to :mod:`infera_core.engines.support`; this re-export stays for one release."""

from infera_core.engines.support import (
    ENGINE_PYTHON_ENV,
    EngineLocation,
    EngineProbe,
    bracket_host,
    dp_layout,
    free_ports,
    http_ok,
    locate_engine,
    metrics_in_flight,
    metrics_sum,
    probe_python,
    reject_managed_flags,
)

__all__ = [
    "ENGINE_PYTHON_ENV",
    "EngineLocation",
    "EngineProbe",
    "bracket_host",
    "dp_layout",
    "free_ports",
    "http_ok",
    "locate_engine",
    "metrics_in_flight",
    "metrics_sum",
    "probe_python",
    "reject_managed_flags",
]

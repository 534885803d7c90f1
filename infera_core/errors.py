"""Typed exceptions. Library code raises these; the CLI prints one clear line."""

from __future__ import annotations

import importlib


class InferaError(Exception):
    """Base class for errors meant to be shown to a user as one line."""


class ConfigError(InferaError):
    """A flag, environment variable or config file has a bad value."""


class PluginError(InferaError):
    """A plugin failed to load or misbehaved."""


class DuplicateNameError(PluginError):
    """Two plugins registered the same name in one registry."""


class UnknownNameError(InferaError, KeyError):
    """A name (engine, policy, decoder…) that no installed plugin provides."""

    def __init__(self, kind: str, name: str, available: list[str], note: str = "") -> None:
        self.kind = kind
        self.name = name
        self.available = available
        self.note = note
        shown = ", ".join(available) if available else "none installed"
        message = f"unknown {kind} {name!r}; available: {shown}"
        super().__init__(f"{message}; {note}" if note else message)

    def __str__(self) -> str:
        return str(self.args[0])


class DiscoveryError(InferaError):
    """The discovery backend (etcd, static file…) failed or is unreachable."""


class EngineError(InferaError):
    """The engine process could not be started, died, or never became ready."""


def require_module(module: str, what: str, extra: str) -> None:
    """A :class:`ConfigError` (one line: ``what`` needs ``module``, and the install) when an
    optional dependency is not installed."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{what}: {module} is not installed (pip install 'infera-core[{extra}]')") from None

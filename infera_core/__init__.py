"""Infera core: hook specs, plugin loading, fleet, KV index, scheduler, server, CLI."""

__version__ = "0.1.0"

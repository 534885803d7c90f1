"""Infera engine plugin for vLLM: launch, KV events, PD (NIXL / Mooncake), drain."""

__version__ = "0.1.0"

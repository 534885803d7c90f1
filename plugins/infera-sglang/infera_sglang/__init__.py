"""Infera engine plugin for SGLang: launch, page size, KV events, DP-attention, bootstrap PD."""

__version__ = "0.1.0"

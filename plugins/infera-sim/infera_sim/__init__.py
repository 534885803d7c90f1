"""Infera simulated engine: an OpenAI-compatible server speaking vLLM's KV event and metrics formats."""

__version__ = "0.1.0"

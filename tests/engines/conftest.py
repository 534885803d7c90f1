"""Fixtures of the real-vLLM tests (defined in real_vllm.py)."""

from real_vllm import serve, vllm_worker  # noqa: F401

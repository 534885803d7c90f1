"""Fixtures of the SGLang adapter tests: a fake SGLang venv (the adapter probes its interpreter)."""

from pathlib import Path

import pytest

from infera_core.testing.engine_env import make_engine_env

SGLANG_MODULE = "sglang.launch_server"


@pytest.fixture
def sglang_python(tmp_path: Path) -> str:
    """A fake SGLang venv's interpreter (``sglang`` 0.5.23, ``sglang.launch_server``)."""
    return make_engine_env(tmp_path, SGLANG_MODULE, dist="sglang", version="0.5.23").python

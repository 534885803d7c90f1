"""Fixtures of the ATOM adapter tests: a fake ATOM venv (the adapter probes its interpreter)."""

from pathlib import Path

import pytest

from infera_core.testing.engine_env import make_engine_env

ATOM_MODULE = "atom.entrypoints.openai_server"


@pytest.fixture
def atom_python(tmp_path: Path) -> str:
    """A fake ATOM venv's interpreter (``atom`` 0.1.0, its OpenAI server module)."""
    return make_engine_env(tmp_path, ATOM_MODULE, dist="atom", version="0.1.0").python

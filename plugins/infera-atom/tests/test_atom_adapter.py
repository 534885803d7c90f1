"""Golden argv tests for the ATOM adapter against ATOM's openai_server flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from atom_golden import ATOM_WORKER
from infera_atom.adapter import AtomAdapter

from infera_core.engines.base import LaunchContext
from infera_core.errors import EngineError
from infera_core.testing.engine_env import flag, launch_context, make_engine_env
from infera_core.worker import Role


def ctx(**kw: object) -> LaunchContext:
    options = {"tp": 8, "block_size": 16, "handshake_port": 0}
    return launch_context({**ATOM_WORKER, "options": options}, 43000, **kw)


def test_openai_server_with_server_port_and_tp(atom_python: str) -> None:
    adapter = AtomAdapter()
    c = ctx(engine_python=atom_python, engine_args=["--kv_cache_dtype", "fp8"])
    spec = adapter.build_launch(c)
    argv = spec.argv
    assert spec.engine_version == "0.1.0"
    assert argv[:3] == [atom_python, "-m", "atom.entrypoints.openai_server"]
    assert flag(argv, "--model") == "/models/ds"
    assert flag(argv, "--served-model-name") == "ds"
    assert flag(argv, "--server-port") == "8888"
    assert flag(argv, "--port") != "8006"  # ATOM's internal engine port: a free one per worker
    assert flag(argv, "-tp") == "8"
    assert argv[-2:] == ["--kv_cache_dtype", "fp8"]
    assert "--kv-transfer-config" not in argv
    fields = adapter.record_fields(c)
    assert fields.pd is None
    assert fields.kv_events is not None and fields.kv_events.format == "atom"  # ATOM's own publisher


@pytest.mark.parametrize(("role", "kv_role"), [(Role.PREFILL, "kv_producer"), (Role.DECODE, "kv_consumer")])
def test_pd_roles_get_the_mooncake_config(atom_python: str, role: Role, kv_role: str) -> None:
    adapter = AtomAdapter()
    c = ctx(engine_python=atom_python, role=role)
    config = json.loads(flag(adapter.build_launch(c).argv, "--kv-transfer-config"))
    # the first of -tp 8 consecutive free ports (ATOM binds handshake_port + tp_rank)
    handshake = config["handshake_port"]
    assert 43000 <= handshake < 43100
    assert config == {
        "kv_connector": "mooncake",
        "kv_role": kv_role,
        "handshake_port": handshake,
        "http_port": 8888,
    }
    pd = adapter.record_fields(c).pd
    assert pd is not None and pd.protocol == "atom-mooncake"
    assert pd.params == {"handshake_port": handshake, "tp_size": 8}


@pytest.mark.parametrize("backend", ["memory", "static"])
def test_discovery_other_than_etcd_is_refused(atom_python: str, backend: str) -> None:
    with pytest.raises(EngineError, match=f"--discovery etcd .*got --discovery {backend}"):
        AtomAdapter().build_launch(ctx(engine_python=atom_python, discovery=backend))


def test_missing_atom_names_the_package(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="ROCm/ATOM"):
        AtomAdapter().build_launch(ctx(engine_python=make_engine_env(tmp_path, None).python))

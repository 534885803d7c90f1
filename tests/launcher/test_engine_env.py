"""Engines never see the launcher's secrets (issue #28 row 14): the admin token, API keys and
credentials in ``INFERA_*`` variables are stripped from an engine's environment."""

from __future__ import annotations

import json
import sys

import pytest

from infera_core.engines.base import LaunchSpec
from infera_core.engines.support import engine_environment, is_infera_secret
from infera_core.launcher.process import EngineProcess

SECRETS = {
    "INFERA_ADMIN_TOKEN": "adm-s3cret",
    "INFERA_API_KEY": "sk-s3cret",
    "INFERA_API_KEY_FILE": "/etc/infera/keys.yaml",
    "INFERA_NATS_CREDS": "/etc/infera/router.creds",
    "INFERA_NATS_PASSWORD": "pw-s3cret",
    "INFERA_ETCD_PASSWORD": "pw-s3cret",
}
KEPT = {
    "INFERA_TOKENIZER": "hf:gpt2",
    "INFERA_TOKENIZE_CACHE_SIZE": "8",
    "INFERA_MODEL": "m",
    "HF_TOKEN": "hf-the-engine-needs-it",  # the engine's own credential, not Infera's
}


async def test_engine_process_environment_has_no_infera_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**SECRETS, **KEPT}.items():
        monkeypatch.setenv(name, value)
    lines: list[str] = []
    dump = "import json, os; print(json.dumps(dict(os.environ)))"
    # what the adapter sets explicitly is passed as given
    spec = LaunchSpec(argv=[sys.executable, "-c", dump], env={"VLLM_SOMETHING": "1"})
    proc = EngineProcess(spec, "[engine]", engine="env-dump", echo=lines.append)
    await proc.start()
    assert await proc.wait() == 0
    [line] = [ln for ln in lines if ln.startswith("[engine] {")]
    env = json.loads(line.removeprefix("[engine] "))
    assert not set(SECRETS) & set(env), sorted(set(SECRETS) & set(env))
    assert "s3cret" not in line
    assert {k: env.get(k) for k in KEPT} == KEPT
    assert env["VLLM_SOMETHING"] == "1" and env["PATH"]


def test_secret_names() -> None:
    assert all(is_infera_secret(name) for name in SECRETS)
    assert not any(is_infera_secret(name) for name in KEPT)
    assert engine_environment({"INFERA_ADMIN_TOKEN": "x", "A": "1"}, {"B": "2"}) == {"A": "1", "B": "2"}

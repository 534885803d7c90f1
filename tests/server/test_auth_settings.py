"""--api-key-file, --admin-token and --public-metrics on `serve` and `up`: flag, env, config key."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner

from infera_core.cli import build_cli
from infera_core.config.settings import resolve
from infera_core.server.settings import ServeSettings
from infera_core.testing.fixtures import make_hooks
from infera_core.up.settings import UpSettings
from infera_core.up.stack import Stack


@pytest.mark.parametrize("command", ["serve", "up"])
def test_help_lists_the_access_flags_with_their_env_vars(command: str) -> None:
    out = CliRunner().invoke(build_cli(make_hooks()), [command, "--help"], terminal_width=200).output
    for flag, env in (
        ("--api-key-file", "INFERA_API_KEY_FILE"),
        ("--admin-token", "INFERA_ADMIN_TOKEN"),
        ("--public-metrics", "INFERA_PUBLIC_METRICS"),
    ):
        assert flag in out and env in out


@pytest.mark.parametrize("model", [ServeSettings, UpSettings])
def test_flag_env_and_config_file_each_set_them(
    model: type[ServeSettings] | type[UpSettings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = tmp_path / "keys.yaml"
    config = tmp_path / "infera.yaml"
    config.write_text(yaml.safe_dump({"public_metrics": True, "admin_token": "from-file"}))
    monkeypatch.setenv("INFERA_ADMIN_TOKEN", "from-env")
    s = resolve(model, {"api_key_file": keys}, config)
    assert s.api_key_file == keys  # flag
    assert s.admin_token is not None and s.admin_token.get_secret_value() == "from-env"  # env over file
    assert s.public_metrics is True  # config file
    assert "from-env" not in repr(s)  # a secret in settings is never printed


async def test_up_hands_them_to_its_server(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"name": "a", "key": "sk-a"}]}))
    settings = UpSettings(workers=0, port=0, api_key_file=keys, admin_token="adm", quiet=True)
    async with Stack(settings, make_hooks()) as stack, httpx.AsyncClient(base_url=stack.root) as c:
        assert (await c.get("/v1/models")).status_code == 401
        assert (await c.get("/v1/models", headers={"Authorization": "Bearer sk-a"})).status_code == 200
        assert (await c.get("/v1/workers")).status_code == 401
        assert (await c.get("/v1/workers", headers={"Authorization": "Bearer adm"})).status_code == 200

"""``up --demo`` on a stack with API keys and an admin token sends its own token."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from rich.console import Console

from infera_core.errors import ConfigError
from infera_core.up.demo import DemoWorkload, run_demo
from infera_core.up.settings import UpSettings
from infera_core.up.stack import Stack

pytest.importorskip("infera_sim")


def _keys(tmp_path: Path) -> Path:
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump({"keys": [{"name": "team", "key": "sk-team"}]}))
    return path


async def test_demo_through_a_keyed_router_uses_the_admin_token(tmp_path: Path) -> None:
    settings = UpSettings(
        workers=2, port=0, quiet=True, drain_timeout=2, api_key_file=_keys(tmp_path), admin_token="adm"
    )
    async with Stack(settings, engine_args=["--speedup", "50"]) as stack:
        w = DemoWorkload(groups=2, questions_per_group=2, prefix_len=64, question_len=8, output_len=2)
        base, routed = await run_demo(stack, Console(quiet=True), w)
    for run in (base, routed):
        assert run.summary["completed"] == 4 and run.summary["failed"] == 0, run.summary
        assert run.summary.get("prefix_cache_hit_rate") is not None  # /v1/workers was readable


async def test_demo_with_keys_but_no_admin_token_is_one_clear_error(tmp_path: Path) -> None:
    stack = Stack(UpSettings(workers=1, port=0, quiet=True, api_key_file=_keys(tmp_path)))
    with pytest.raises(ConfigError, match="needs --admin-token"):
        await run_demo(stack, Console(quiet=True))

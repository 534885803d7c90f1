"""``infera-run serve``: the OpenAI/Anthropic-compatible server in front of the fleet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from infera_core.facade import InferaHooks
from infera_core.server.settings import ServeSettings
from infera_core.settings import click_options, config_option, resolve


@click.command("serve")
@config_option
@click_options(ServeSettings)
@click.pass_obj
def serve_cmd(hooks: InferaHooks, /, config_file: Path | None, **values: Any) -> None:
    """Serve /v1/chat/completions, /v1/completions, /v1/messages, /v1/models… for the fleet."""
    from infera_core.server.run import run

    settings = resolve(ServeSettings, values, config_file)
    run(settings, hooks)

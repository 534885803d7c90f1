"""``infera-run serve``: the OpenAI/Anthropic-compatible server in front of the fleet."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from infera_core.facade import InferaHooks
from infera_core.server.settings import ServeSettings
from infera_core.settings import SettingsCommand, click_options, command_settings, config_option, resolve


@click.command("serve", cls=SettingsCommand, base=ServeSettings)
@config_option
@click_options(ServeSettings)
@click.pass_context
def serve_cmd(ctx: click.Context, /, config_file: Path | None, **values: Any) -> None:
    """Serve /v1/chat/completions, /v1/completions, /v1/messages, /v1/models… for the fleet."""
    from infera_core.server.run import run
    from infera_core.server.transport import require_http_client

    hooks: InferaHooks = ctx.obj
    settings = resolve(command_settings(ctx, ServeSettings), values, config_file)
    require_http_client(settings.http_client)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the dashboard's scrapes: one line each otherwise
    run(settings, hooks)

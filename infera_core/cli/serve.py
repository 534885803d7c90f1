"""``infera-run serve``: the OpenAI/Anthropic-compatible server in front of the fleet."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from infera_core.config.settings import click_options, config_option, resolve
from infera_core.plugin.hooks import InferaHooks
from infera_core.plugin.settings import SettingsCommand, command_settings
from infera_core.server.settings import ServeSettings


@click.command("serve", cls=SettingsCommand, base=ServeSettings)
@config_option
@click_options(ServeSettings)
@click.pass_context
def serve_cmd(ctx: click.Context, /, config_file: Path | None, **values: Any) -> None:
    """Serve /v1/chat/completions, /v1/completions, /v1/messages, /v1/models… for the fleet."""
    from infera_core.server.run import run
    from infera_core.transports.http import require_http_client

    hooks: InferaHooks = ctx.obj
    settings = resolve(command_settings(ctx, ServeSettings), values, config_file)
    require_http_client(settings.http_client)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the dashboard's scrapes: one line each otherwise
    run(settings, hooks)

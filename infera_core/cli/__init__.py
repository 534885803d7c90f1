"""The ``infera-run`` command line.

Plugins are loaded before click parses arguments (plugins add subcommands), so
``--strict-plugins`` is read from argv/env first. Core's subcommands are imported only
when they run (:mod:`infera_core.cli.lazy_group`): ``--help`` stays fast. Every :class:`InferaError` ends
the program with one clear line on stderr and exit status 1; no tracebacks.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

import click

from infera_core import __version__
from infera_core.cli.lazy_group import LazyGroup
from infera_core.errors import InferaError
from infera_core.plugin.hooks import InferaHooks


def _versions(hooks: InferaHooks) -> str:
    lines = [f"infera-core {__version__}"]
    for info in hooks.plugins.infos:
        if info.distribution and info.distribution != "infera-core":
            lines.append(f"{info.distribution} {info.version} ({info.name}: {info.status})")
    return "\n".join(lines)


def build_cli(hooks: InferaHooks) -> click.Group:
    @click.group(
        cls=LazyGroup,
        context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
    )
    @click.option(
        "--strict-plugins",
        is_flag=True,
        help="Fail when any plugin fails to load. [env: INFERA_STRICT_PLUGINS]",
    )
    @click.option(
        "--log-level",
        default=lambda: os.environ.get("INFERA_LOG_LEVEL", "info"),
        type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
        help="Log level. [env: INFERA_LOG_LEVEL]",
    )
    @click.version_option(message=_versions(hooks), version=__version__)
    @click.pass_context
    def cli(ctx: click.Context, strict_plugins: bool, log_level: str) -> None:
        """Infera: one OpenAI-compatible endpoint in front of a fleet of LLM engines."""
        logging.basicConfig(
            level=getattr(logging, log_level.upper()),
            format="%(asctime)s %(levelname)s %(name)s %(message)s",
            stream=sys.stderr,
        )
        ctx.obj = hooks

    hooks.register_commands(cli)
    return cli


def _strict_requested(argv: Sequence[str]) -> bool:
    if "--strict-plugins" in argv:
        return True
    return os.environ.get("INFERA_STRICT_PLUGINS", "").lower() in {"1", "true", "yes", "on"}


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        hooks = InferaHooks.load(strict=_strict_requested(args))
        cli = build_cli(hooks)
        cli.main(args=args, prog_name="infera-run", standalone_mode=True)
    except InferaError as exc:
        click.echo(f"infera-run: error: {exc}", err=True)
        sys.exit(1)

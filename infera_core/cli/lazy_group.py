"""A click group whose subcommands are imported only when they run.

``infera-run --help`` lists every subcommand with its one-line help; importing each
command's module for that (the launcher, the bench, the server settings…) cost most
of the start-up time. A lazy entry carries its one-line help, and the module is
imported when the subcommand is invoked (or its own ``--help`` is asked for).
Commands added with ``add_command`` (plugins do) work as in any click group and win
over a lazy entry of the same name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import click


@dataclass(frozen=True, slots=True)
class LazyCommand:
    """Where a subcommand lives (``"package.module:attribute"``) and its one-line help."""

    target: str
    short_help: str

    def load(self) -> click.Command:
        module_name, _, attr = self.target.partition(":")
        cmd = getattr(importlib.import_module(module_name), attr)
        if not isinstance(cmd, click.Command):
            raise TypeError(f"{self.target} is not a click command")
        return cmd


class LazyGroup(click.Group):
    """A :class:`click.Group` that also holds subcommands by import path."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy_commands: dict[str, LazyCommand] = {}

    def add_lazy_command(self, name: str, target: str, short_help: str) -> None:
        """Register ``target`` (``"module:attribute"``) as subcommand ``name``, imported on use.

        A command already added under ``name`` (a plugin's own) is kept.
        """
        if name not in self.commands:
            self.lazy_commands[name] = LazyCommand(target, short_help)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        super().add_command(cmd, name)
        self.lazy_commands.pop(name or cmd.name or "", None)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        lazy = self.lazy_commands.get(cmd_name)
        if lazy is not None:
            self.add_command(lazy.load(), cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List subcommands with their one-line help, without importing the lazy ones."""
        rows: list[tuple[str, str]] = []
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max((len(n) for n in names), default=0)
        for name in names:
            lazy = self.lazy_commands.get(name)
            if lazy is not None:
                rows.append((name, lazy.short_help))
                continue
            cmd = self.commands[name]
            if not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

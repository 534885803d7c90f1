"""``infera-run up --help``: every installed engine's options, as ``worker <engine> --help`` shows them.

``up`` passes everything after ``--`` to its workers; an adapter option's flag or an engine
spelling Infera knows (``--block-size``, ``--tensor-parallel-size``…) sets the adapter's
option, anything else goes to the engine unchanged.
"""

from __future__ import annotations

import click

from infera_core.engines.base import FlagAliases
from infera_core.errors import InferaError
from infera_core.plugin.hooks import InferaHooks
from infera_core.plugin.settings import SettingsCommand


def engine_option_rows(hooks: InferaHooks, engine: str) -> list[tuple[str, str]]:
    """(flag, help) rows of one engine's options after ``--``, aliases of them included."""
    adapter = hooks.require("engine", engine)
    rows = []
    flags = {opt.flag for opt in adapter.options()}
    for opt in adapter.options():
        shown = f" [default: {opt.default}]" if opt.default not in (None, "") else ""
        rows.append((opt.flag, f"{opt.help}{shown}"))
    if isinstance(adapter, FlagAliases):
        for spelled, alias in adapter.flag_aliases().items():
            if spelled != alias.target and (alias.target in flags or not alias.target):
                rows.append(
                    (spelled, f"same as {alias.target}" if alias.target else "accepted (Infera does it)")
                )
    return rows


class UpCommand(SettingsCommand):
    """``up``: its help ends with the options each installed engine takes after ``--``."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        hooks = ctx.find_object(InferaHooks)
        if hooks is None:
            return
        for engine in hooks.catalog().engines.names():
            try:
                rows = engine_option_rows(hooks, engine)
            except InferaError:
                continue
            if rows:
                with formatter.section(f"Engine options after -- (--engine {engine})"):
                    formatter.write_dl(rows)

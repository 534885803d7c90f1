"""``infera-run engines``: every engine adapter, who provides it, and its own flags."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infera_core.engines.base import EngineOption
from infera_core.plugin.hooks import InferaHooks


def option_as_dict(opt: EngineOption) -> dict[str, Any]:
    """An :class:`EngineOption` as JSON-friendly data (flag, env var, type, default…)."""
    default = opt.default
    if default is not None and not isinstance(default, str | int | float | bool):
        default = str(default)
    return {
        "name": opt.name,
        "flag": opt.flag,
        "env": opt.envvar,
        "type": getattr(opt.type, "__name__", str(opt.type)),
        "default": default,
        "is_flag": opt.is_flag,
        "choices": list(opt.choices) if opt.choices is not None else None,
        "help": opt.help,
    }


def describe_engines(hooks: InferaHooks) -> list[dict[str, Any]]:
    """name, plugin, distribution, description, package hint and options of every adapter."""
    out: list[dict[str, Any]] = []
    for entry in hooks.catalog().engines.entries():
        adapter = entry.obj
        info = hooks.plugins.info(entry.owner)
        out.append(
            {
                "name": entry.name,
                "plugin": entry.owner,
                "distribution": info.distribution if info else None,
                "version": info.version if info else None,
                "description": adapter.description,
                "package_hint": adapter.package_hint,
                "options": [option_as_dict(o) for o in adapter.options()],
            }
        )
    return out


def _option_line(o: dict[str, Any]) -> str:
    line = f"{o['flag']} [{o['env']}]"
    if o["help"]:
        line += f": {o['help']}"
    if o["default"] not in (None, False, ""):
        line += f" [default: {o['default']}]"
    return line


def warn_failed_plugins(hooks: InferaHooks) -> None:
    """One stderr line when some plugin failed to load (what it provides is missing)."""
    problems = hooks.plugin_problems()
    if hooks.plugins.failed() and problems:
        click.echo(f"infera-run: warning: {problems}", err=True)


def listed_as_json(hooks: InferaHooks, data: Any, as_json: bool) -> bool:
    """What the listing commands do first: warn about plugins that failed to load, then print
    ``data`` as JSON when ``--json`` asked for it (True: nothing more to print)."""
    warn_failed_plugins(hooks)
    if as_json:
        click.echo(json.dumps(data, indent=2))
    return as_json


@click.command("engines")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_obj
def engines_cmd(hooks: InferaHooks, as_json: bool) -> None:
    """List engine adapters: name, owning plugin, description and engine-specific flags."""
    rows = describe_engines(hooks)
    if listed_as_json(hooks, rows, as_json):
        return
    if not rows:
        click.echo("no engine adapters installed (try: pip install infera-sim)")
        return
    table = Table("engine", "plugin (distribution)", "description", "options")
    for row in rows:
        owner = f"{row['plugin']} ({row['distribution'] or '-'})"
        opts = "\n".join(_option_line(o) for o in row["options"])
        table.add_row(*(escape(c) for c in (row["name"], owner, row["description"], opts or "-")))
    Console().print(table)

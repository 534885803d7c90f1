"""``infera-run plugins``: what is installed, its status, and what it provides."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infera_core.errors import InferaError
from infera_core.plugin.hooks import InferaHooks


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--all", "show_all", is_flag=True, help="Include core's built-in plugin and disabled plugins.")
@click.pass_obj
def plugins_cmd(hooks: InferaHooks, as_json: bool, show_all: bool) -> None:
    """List installed plugins: name, distribution, version, status, what each provides."""
    try:
        provides = hooks.catalog().provides()
        catalog_error = None
    except InferaError as exc:
        provides = {}
        catalog_error = str(exc)
    rows = []
    for info in hooks.plugins.infos:
        if not show_all and (info.name == "core" or info.status == "disabled"):
            continue
        info.provides = provides.get(info.name, {})
        rows.append(info)
    if as_json:
        out = [i.as_dict() for i in rows]
        click.echo(json.dumps(out, indent=2))
    else:
        table = Table("name", "distribution", "version", "status", "provides")
        for i in rows:
            status = i.status if not i.error else f"{i.status}: {i.error}"
            prov = "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(i.provides.items()))
            cells = (i.name, i.distribution or "-", i.version or "-", status, prov)
            table.add_row(*(escape(c) for c in cells))  # errors may contain [brackets]
        Console().print(table)
    if catalog_error:
        raise InferaError(catalog_error)

"""``infera-run policies``: filters, scorers and pickers with their parameter schemas, and presets."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infera_core.cli.engines import listed_as_json
from infera_core.plugin.hooks import InferaHooks

KINDS = ("filter", "scorer", "picker")


def describe_policies(hooks: InferaHooks) -> dict[str, Any]:
    """``{"filters": [...], "scorers": [...], "pickers": [...], "presets": [...]}``."""
    policies = hooks.catalog().policies
    out: dict[str, Any] = {f"{kind}s": [] for kind in KINDS}

    def distribution(owner: str) -> str | None:
        info = hooks.plugins.info(owner)
        return info.distribution if info else None

    for entry in policies.entries():
        factory = entry.obj
        out[f"{factory.kind}s"].append(
            {
                "name": factory.name,
                "plugin": entry.owner,
                "distribution": distribution(entry.owner),
                "description": factory.description,
                "params_schema": factory.params.model_json_schema() if factory.params else None,
            }
        )
    out["presets"] = [
        {
            "name": p.name,
            "plugin": p.owner,
            "distribution": distribution(p.owner),
            "description": p.obj.description,
            "profile": p.obj.profile.model_dump(mode="json"),
        }
        for p in policies.preset_entries()
    ]
    return out


def _params_summary(schema: dict[str, Any] | None) -> str:
    if not schema:
        return "-"
    props: dict[str, Any] = schema.get("properties", {})
    parts = []
    for name, prop in props.items():
        kind = prop.get("type") or "/".join(str(a.get("type", "?")) for a in prop.get("anyOf", [])) or "?"
        default = f"={prop['default']!r}" if "default" in prop else ""
        parts.append(f"{name}: {kind}{default}")
    return "\n".join(parts) or "-"


@click.command("policies")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with full parameter JSON schemas).")
@click.pass_obj
def policies_cmd(hooks: InferaHooks, as_json: bool) -> None:
    """List routing filters, scorers, pickers (with parameters) and presets (--router-policy)."""
    data = describe_policies(hooks)
    if listed_as_json(hooks, data, as_json):
        return
    console = Console()
    table = Table("kind", "name", "plugin", "description", "parameters")
    for kind in KINDS:
        for row in data[f"{kind}s"]:
            cells = (
                kind,
                row["name"],
                row["plugin"],
                row["description"],
                _params_summary(row["params_schema"]),
            )
            table.add_row(*(escape(c) for c in cells))
    if table.row_count:
        console.print(table)
    else:
        click.echo("no filters, scorers or pickers installed")
    presets = Table("preset", "plugin", "description", "profile")
    for row in data["presets"]:
        prof = row["profile"]
        summary = " | ".join(
            [
                "filters: " + (", ".join(f["name"] for f in prof["filters"]) or "-"),
                "scorers: " + (", ".join(f"{s['name']}×{s['weight']:g}" for s in prof["scorers"]) or "-"),
                "picker: " + prof["picker"]["name"],
            ]
        )
        presets.add_row(*(escape(c) for c in (row["name"], row["plugin"], row["description"], summary)))
    if presets.row_count:
        console.print(presets)
    else:
        click.echo("no presets installed")

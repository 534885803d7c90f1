"""``infera-run workers``: list the fleet as the discovery backend sees it (table or JSON)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import click
from pydantic import Field
from rich.console import Console
from rich.table import Table

from infera_core.config.settings import (
    InferaSettings,
    click_options,
    config_option,
    resolve,
)
from infera_core.discovery.base import (
    DiscoverySettings,
    discovery_prefix_field,
    discovery_timeout_field,
    etcd_endpoint_field,
)
from infera_core.errors import ConfigError
from infera_core.plugin.hooks import InferaHooks
from infera_core.plugin.settings import SettingsCommand, command_settings
from infera_core.util.redact import redact_url
from infera_core.worker import WorkerRecord


class WorkersSettings(InferaSettings):
    discovery: str | None = Field(
        None,
        description="Discovery backend: etcd, nats, static… [default: etcd when --etcd-endpoint is set].",
        json_schema_extra={"flag": "--discovery-backend", "aliases": ["--discovery"]},
    )
    etcd_endpoint: str | None = etcd_endpoint_field()
    discovery_prefix: str = discovery_prefix_field()
    static_file: str | None = Field(
        None, description="Worker list file (YAML/JSON) of --discovery-backend static."
    )
    discovery_timeout: float = discovery_timeout_field("Seconds to wait for the discovery backend.")


async def list_fleet(hooks: InferaHooks, settings: WorkersSettings) -> list[WorkerRecord]:
    name = settings.discovery or (
        "etcd" if settings.etcd_endpoint else "static" if settings.static_file else None
    )
    if name is None:
        raise ConfigError(
            "pass --etcd-endpoint HOST:PORT, --discovery-backend nats --nats-url URL "
            "or --discovery-backend static --static-file FILE"
        )
    factory = hooks.require("discovery_backend", name)
    discovery = factory.create(DiscoverySettings.of(settings))
    await discovery.start()
    try:
        return await discovery.list_workers()
    finally:
        await discovery.close()


def _age(started_at: float) -> str:
    secs = max(0, int(time.time() - started_at))
    return f"{secs // 3600}h{secs % 3600 // 60:02d}m" if secs >= 3600 else f"{secs // 60}m{secs % 60:02d}s"


@click.command("workers", cls=SettingsCommand, base=WorkersSettings)
@config_option
@click_options(WorkersSettings)
@click.option("--json", "as_json", is_flag=True, help="Print the worker records as JSON.")
@click.pass_context
def workers_cmd(ctx: click.Context, /, config_file: Path | None, as_json: bool, **values: object) -> None:
    """List the workers registered in the fleet (etcd, NATS, a static file…)."""
    hooks: InferaHooks = ctx.obj
    settings = resolve(command_settings(ctx, WorkersSettings), values, config_file)
    records = asyncio.run(list_fleet(hooks, settings))
    if as_json:
        click.echo(json.dumps([r.model_dump(mode="json") for r in records], indent=2))
        return
    if not records:
        click.echo("no workers registered")
        return
    table = Table(
        "worker_id", "engine", "model", "role", "status", "url", "via", "dp", "kv events", "pd", "up"
    )
    for r in records:
        dp = f"{r.dp_rank}/{r.dp_size}" if r.dp_rank is not None else str(r.dp_size)
        kv = f"{r.kv_events.format} {r.kv_events.endpoint}" if r.kv_events else "-"
        if r.kv_events and r.kv_event_transport != "zmq":
            kv = f"{r.kv_events.format} via {r.kv_event_transport}"
        engine = f"{r.engine} {r.engine_version}" if r.engine_version else r.engine
        table.add_row(
            r.worker_id,
            engine,
            r.model,
            r.role.value,
            r.status.value,
            redact_url(r.url),
            r.request_transport,
            dp,
            kv,
            r.pd.protocol if r.pd else "-",
            _age(r.started_at),
        )
    Console(width=200).print(table)

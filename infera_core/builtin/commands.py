"""Core subcommands of ``infera-run``."""

from __future__ import annotations

import click

from infera_core.hookspecs import hookimpl


@hookimpl
def infera_register_commands(cli: click.Group) -> None:
    from infera_core.cli import bench, engines, plugins, policies

    for cmd in (plugins.plugins_cmd, engines.engines_cmd, policies.policies_cmd, bench.bench_cmd):
        cli.add_command(cmd)
    from infera_core.cli import worker, workers

    cli.add_command(worker.worker_cmd)
    cli.add_command(workers.workers_cmd)
    from infera_core.cli import serve

    cli.add_command(serve.serve_cmd)
    from infera_core.cli import up

    cli.add_command(up.up_cmd)

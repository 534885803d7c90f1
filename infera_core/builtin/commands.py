"""Core subcommands of ``infera-run``.

They are registered lazily (module path + one-line help): ``infera-run --help`` and a
subcommand import only what they use. ``tests/cli/test_cli_startup.py`` checks that each
one-line help here matches the command's own docstring.
"""

from __future__ import annotations

import click

from infera_core.cli.lazy_group import LazyCommand, LazyGroup
from infera_core.plugin.spec import hookimpl

#: subcommand name -> ("module:attribute", one-line help)
CORE_COMMANDS: dict[str, tuple[str, str]] = {
    "plugins": (
        "infera_core.cli.plugins:plugins_cmd",
        "List installed plugins: name, distribution, version, status, what each provides.",
    ),
    "engines": (
        "infera_core.cli.engines:engines_cmd",
        "List engine adapters: name, owning plugin, description and engine-specific flags.",
    ),
    "policies": (
        "infera_core.cli.policies:policies_cmd",
        "List routing filters, scorers, pickers (with parameters) and presets (--router-policy).",
    ),
    "bench": (
        "infera_core.cli.bench:bench_cmd",
        "Benchmark an OpenAI-compatible endpoint (Infera, one engine, or another router).",
    ),
    "calibrate": (
        "infera_core.cli.calibrate:calibrate_cmd",
        "Measure a running engine (prefill, decode, concurrency) and write a sim timing profile.",
    ),
    "plan": (
        "infera_core.cli.plan:plan_cmd",
        "Find the smallest fleet that meets an SLO on a trace, by replaying it in virtual time.",
    ),
    "worker": (
        "infera_core.cli.worker:worker_cmd",
        "Run an engine as a fleet worker: infera-run worker <engine> [infera flags] -- [engine flags].",
    ),
    "workers": (
        "infera_core.cli.workers:workers_cmd",
        "List the workers registered in the fleet (etcd, NATS, a static file…).",
    ),
    "serve": (
        "infera_core.cli.serve:serve_cmd",
        "Serve /v1/chat/completions, /v1/completions, /v1/messages, /v1/models… for the fleet.",
    ),
    "up": (
        "infera_core.cli.up:up_cmd",
        "Start discovery, the server and N workers here; Ctrl-C drains and stops everything.",
    ),
}


@hookimpl
def infera_register_commands(cli: click.Group) -> None:
    for name, (target, short_help) in CORE_COMMANDS.items():
        if isinstance(cli, LazyGroup):
            cli.add_lazy_command(name, target, short_help)
        else:  # a plain click group (a plugin author's own test harness): import now
            cli.add_command(LazyCommand(target, short_help).load(), name)

"""``infera-run worker <engine> [infera flags] -- [engine flags]``: run one engine as a fleet worker.

``worker`` is a click group whose subcommands are the installed engine adapters; each
engine's command has Infera's own flags (:class:`WorkerSettings`) plus the adapter's
:class:`EngineOption` flags, every one with an ``INFERA_*`` env var.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import click

from infera_core.config.settings import click_options, compose_settings, read_config_file, resolve
from infera_core.engines.base import (
    OPTION_CLASH_HINT,
    EngineAdapter,
    EngineOption,
    FlagAliases,
    option_clashes,
)
from infera_core.engines.settings import WorkerSettings
from infera_core.errors import PluginError
from infera_core.launcher.flags import split_flat
from infera_core.launcher.runtime import run_worker
from infera_core.plugin.hooks import InferaHooks
from infera_core.plugin.settings import backend_models

OPT_PREFIX = "engine_opt_"

CONFIG_OPTION = click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path),
    default=None,
    help="YAML/JSON file of settings, engine options included (lower priority than flags and env). "
    "[env: INFERA_CONFIG]",
    envvar="INFERA_CONFIG",
)

ENGINE_HELP = """Run the {engine} engine as a fleet worker: start it, wait until it serves,
register it for discovery, and drain it on SIGTERM/SIGINT (a second signal stops at once).

{description}

Everything after -- is passed to the engine unchanged, except the engine options below (and
the engine's own spellings of them, e.g. --tensor-parallel-size for --tp), which set them, e.g.
infera-run worker {engine} --model m --etcd-endpoint 127.0.0.1:2379 -- --some-engine-flag 1

vllm, sglang and atom also take one flat list: python -m infera.engine.<engine> --model m --port 30000 …"""


def _engine_option(opt: EngineOption) -> click.Option:
    help_text = f"{opt.help} [env: {opt.envvar}]".strip()
    ctype: Any = click.Choice(list(opt.choices)) if opt.choices else opt.type
    if opt.is_flag:
        return click.Option(
            [f"{opt.flag}/--no-{opt.flag[2:]}", OPT_PREFIX + opt.name],
            is_flag=True,
            default=None,
            envvar=opt.envvar,
            help=help_text,
        )
    shown = f" [default: {opt.default}]" if opt.default not in (None, "") else ""
    return click.Option(
        [opt.flag, OPT_PREFIX + opt.name],
        type=ctype,
        default=None,
        envvar=opt.envvar,
        help=f"{opt.help}{shown} [env: {opt.envvar}]".strip() if shown else help_text,
    )


def _engine_command(hooks: InferaHooks, adapter: EngineAdapter) -> click.Command:
    model = compose_settings(WorkerSettings, backend_models(hooks.catalog()))  # + plugin backends' flags

    @click.pass_context
    def callback(
        ctx: click.Context, /, config_file: Path | None, engine_args: tuple[str, ...], **values: Any
    ) -> None:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health check otherwise
        infera = {k: v for k, v in values.items() if not k.startswith(OPT_PREFIX)}
        settings = resolve(model, infera, config_file)
        file_data = read_config_file(config_file) if config_file else {}
        options = {}
        for key, value in values.items():
            if key.startswith(OPT_PREFIX):
                name = key[len(OPT_PREFIX) :]
                options[name] = value if value is not None else file_data.get(name)
        code = asyncio.run(
            run_worker(hooks, adapter.name, settings, engine_args=list(engine_args), options=options)
        )
        ctx.exit(code)

    command = click.command(
        adapter.name,
        help=ENGINE_HELP.format(engine=adapter.name, description=adapter.description),
        short_help=adapter.description,
        context_settings={"max_content_width": 110},
    )(CONFIG_OPTION(click_options(model)(callback)))
    taken = {o for p in command.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}
    clashes = option_clashes(adapter, taken)
    if clashes:  # the catalog refuses such an adapter at load; this guards hooks built without it
        raise PluginError(
            f"engine {adapter.name!r}: options named like Infera's own flags: {', '.join(clashes)}; "
            + OPTION_CLASH_HINT
        )
    command.params += [_engine_option(opt) for opt in adapter.options()]
    command.params.append(click.Argument(["engine_args"], nargs=-1, type=click.UNPROCESSED))
    return command


class EngineGroup(click.Group):
    """One subcommand per installed engine adapter, built on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        hooks: InferaHooks = ctx.find_object(InferaHooks) or ctx.ensure_object(InferaHooks)
        return hooks.catalog().engines.names()

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        hooks: InferaHooks = ctx.find_object(InferaHooks) or ctx.ensure_object(InferaHooks)
        adapter = hooks.require("engine", cmd_name)  # unknown → one line listing the engines
        return _engine_command(hooks, adapter)


@click.group(
    "worker",
    cls=EngineGroup,
    help="Run an engine as a fleet worker: infera-run worker <engine> [infera flags] -- [engine flags]. "
    "Everything after -- goes to the engine. See infera-run worker <engine> --help.",
)
def worker_cmd() -> None:
    pass


def flat_worker_args(hooks: InferaHooks, engine: str, args: list[str]) -> list[str]:
    """``worker <engine>`` argv for one flat flag list (``python -m infera.engine.<engine> …``).

    Infera's flags are taken, the engine's spellings of Infera settings are translated
    (``--tensor-parallel-size 2`` → ``--tp 2``), everything else goes after ``--``.
    """
    adapter = hooks.require("engine", engine)
    command = _engine_command(hooks, adapter)
    taken = {"--help": False}
    for param in command.params:
        if isinstance(param, click.Option):
            for opt in (*param.opts, *param.secondary_opts):
                taken[opt] = not param.is_flag
    aliases = adapter.flag_aliases() if isinstance(adapter, FlagAliases) else {}
    infera, rest = split_flat(args, taken, aliases)
    if "--model-path" in infera and "--model" not in infera and not os.environ.get("INFERA_MODEL"):
        infera += ["--model", infera[infera.index("--model-path") + 1]]  # SGLang's seed form
    return ["worker", engine, *infera, "--", *rest]

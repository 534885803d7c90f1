"""``infera-run`` starts fast: subcommands are imported only when they run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from infera_core.builtin.commands import CORE_COMMANDS
from infera_core.cli import build_cli
from infera_core.cli.lazy_group import LazyCommand
from infera_core.plugin.spec import hookimpl
from infera_core.testing.fixtures import make_hooks

SUBCOMMAND_MODULES = sorted(target.partition(":")[0] for target, _ in CORE_COMMANDS.values())

# run main() in a fresh interpreter, then print which subcommand modules it imported
PROBE = """
import json, sys
from infera_core.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("\\nMODULES " + json.dumps(sorted(m for m in sys.modules if m.startswith("infera_core.cli."))))
"""


def _run(*args: str) -> tuple[str, set[str]]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    text, _, modules = out.rpartition("\nMODULES ")
    return text, set(json.loads(modules))


@pytest.mark.parametrize("name", sorted(CORE_COMMANDS))
def test_each_lazy_one_line_help_is_the_commands_own(name: str) -> None:
    target, short_help = CORE_COMMANDS[name]
    cmd = LazyCommand(target, short_help).load()
    assert cmd.name == name
    assert short_help == cmd.get_short_help_str(limit=10_000)


def test_help_lists_every_subcommand_without_importing_any() -> None:
    text, modules = _run("--help")
    for name, (_, short_help) in CORE_COMMANDS.items():
        assert f"  {name} " in text
        assert short_help.split()[0] in text
    assert modules.isdisjoint(SUBCOMMAND_MODULES), modules & set(SUBCOMMAND_MODULES)


def test_a_subcommand_imports_only_its_own_module(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps([{"url": "http://127.0.0.1:9001", "model": "m", "engine": "sim"}]))
    text, modules = _run("workers", "--static-file", str(fleet), "--json")
    assert json.loads(text)[0]["worker_id"] == "127.0.0.1:9001"
    assert modules & set(SUBCOMMAND_MODULES) == {"infera_core.cli.workers"}


def test_subcommand_help_still_shows_its_options() -> None:
    result = CliRunner().invoke(build_cli(make_hooks()), ["workers", "--help"])
    assert result.exit_code == 0 and "--static-file" in result.output


class Override:
    @hookimpl
    def infera_register_commands(self, cli: click.Group) -> None:
        @click.command("bench")
        def bench() -> None:
            """A plugin's own bench."""
            click.echo("plugin bench")

        cli.add_command(bench)


def test_a_plugin_command_replaces_a_lazy_one_of_the_same_name() -> None:
    cli = build_cli(make_hooks(("override", Override())))
    assert CliRunner().invoke(cli, ["bench"]).output == "plugin bench\n"
    assert "A plugin's own bench." in CliRunner().invoke(cli, ["--help"]).output


def test_a_plain_click_group_gets_the_real_commands() -> None:
    group = click.Group()
    make_hooks().register_commands(group)
    assert set(CORE_COMMANDS) <= set(group.commands)
    assert isinstance(group.commands["serve"], click.Command)

"""One spelling per concept across ``infera-run``'s commands.

Walks every command's options (click introspection, plugin subcommands and per-engine
``worker`` commands included) and fails when one flag means different settings in two
commands, when one setting has different primary flags in two commands, or when a
command's primary flag is a known synonym of the project's spelling (aliases may keep
an old spelling working).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import click

from infera_core.cli import build_cli
from infera_core.plugin.hooks import InferaHooks

SYNONYMS = {
    # old or other spelling -> the project's spelling of the concept
    "--policy": "--router-policy",
    "--etcd-prefix": "--discovery-prefix",
    "--prefix": "--discovery-prefix",
    "--discovery": "--discovery-backend",
    "--backend": "--discovery-backend",
}
"""Spellings that may appear only as aliases."""

SAME_FLAG_OK: set[str] = {"--help", "--json", "--model"}
"""Flags whose settings differ by command on purpose (command-local meanings)."""

SAME_SETTING = {"policy": "router_policy"}
"""Setting names that hold one concept under two field names (up's ``policy``)."""


def _setting(name: str) -> str:
    name = name.removeprefix("engine_opt_")  # an engine option up passes through (--pd-protocol)
    return SAME_SETTING.get(name, name)


def _options(cmd: click.Command, ctx: click.Context, path: str) -> Iterator[tuple[str, click.Option]]:
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None:
                yield from _options(sub, click.Context(sub, parent=ctx, info_name=name), f"{path} {name}")
        return
    for param in cmd.get_params(ctx):
        if isinstance(param, click.Option):
            yield path, param


def _walk() -> list[tuple[str, click.Option]]:
    hooks = InferaHooks.load()
    cli = build_cli(hooks)
    with click.Context(cli, info_name="infera-run", obj=hooks) as ctx:
        return [(path, opt) for path, opt in _options(cli, ctx, "infera-run") if path != "infera-run"]


def test_the_walk_sees_every_command_with_settings() -> None:
    paths = {path for path, _ in _walk()}
    for expected in ("infera-run serve", "infera-run up", "infera-run workers", "infera-run bench"):
        assert expected in paths
    assert any(p.startswith("infera-run worker ") for p in paths), sorted(paths)


def test_one_spelling_per_concept_across_commands() -> None:
    by_flag: dict[str, set[tuple[str, str]]] = defaultdict(set)  # flag -> {(setting, command)}
    primary: dict[str, set[tuple[str, str]]] = defaultdict(set)  # setting -> {(primary flag, command)}
    problems: list[str] = []
    for path, opt in _walk():
        flags = [o for o in opt.opts if o.startswith("--")]
        if not flags or opt.name is None:
            continue
        first = flags[0].split("/")[0]
        primary[_setting(opt.name)].add((first, path))
        if first in SYNONYMS:
            problems.append(
                f"{path}: {first} is spelt {SYNONYMS[first]} elsewhere (keep {first} as an alias)"
            )
        for flag in flags:
            by_flag[flag].add((_setting(opt.name), path))
    for flag, uses in sorted(by_flag.items()):
        settings = {s for s, _ in uses}
        if len(settings) > 1 and flag not in SAME_FLAG_OK:
            problems.append(f"{flag} means different settings: {sorted(uses)}")
    for setting, uses in sorted(primary.items()):
        if len({f for f, _ in uses}) > 1:
            problems.append(f"setting {setting} has different flags: {sorted(uses)}")
    assert not problems, "\n".join(problems)

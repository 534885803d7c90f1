"""Engine spellings of what Infera manages: one flat flag list, and flags after ``--``.

``python -m infera.engine.<name> …`` takes one flat list: Infera's own flags are taken,
an engine's spelling of an Infera setting (:class:`~infera_core.engines.base.FlagAlias`, e.g.
vLLM ``--tensor-parallel-size 2``) becomes the Infera flag (``--tp 2``), and everything
else goes to the engine unchanged (:func:`split_flat`). Flags after ``--`` of
``infera-run worker``/``up`` whose alias names an adapter option (``--block-size 32``)
become that option (:func:`adopt_option_aliases`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infera_core.engines.base import EngineAdapter, FlagAlias, FlagAliases
from infera_core.errors import ConfigError


def _value(args: list[str], i: int, takes_value: bool) -> tuple[str | None, int]:
    """The value of the flag at ``args[i]`` and the index after it."""
    name, eq, inline = args[i].partition("=")
    if eq:
        return inline, i + 1
    if not takes_value:
        return None, i + 1
    if i + 1 >= len(args):
        raise ConfigError(f"{name} needs a value")
    return args[i + 1], i + 2


def _translate(name: str, value: str | None, alias: FlagAlias) -> list[str]:
    if not alias.target:
        return []
    if value is None:
        return [alias.target]
    if alias.values is not None:
        if value not in alias.values:
            raise ConfigError(f"{name} {value}: expected one of {', '.join(alias.values)}")
        value = alias.values[value]
    return [alias.target, value]


def _record(seen: dict[str, tuple[str, str | None]], target: str, spelled: str, value: str | None) -> None:
    """Refuse one setting given twice with different values (``--tp 2 -tp 4``)."""
    before = seen.get(target)
    if before is not None and before[1] != value:
        raise ConfigError(
            f"conflicting flags: {before[0]} {before[1]} and {spelled} {value} set the same thing ({target})"
        )
    seen[target] = (spelled, value)


def split_flat(
    args: list[str], taken: Mapping[str, bool], aliases: Mapping[str, FlagAlias]
) -> tuple[list[str], list[str]]:
    """Split one flat flag list into (Infera argv, engine argv).

    ``taken`` maps each Infera flag to whether it takes a value. Tokens after a literal
    ``--`` all go to the engine. A flag in both ``taken`` and ``aliases`` is Infera's.
    """
    infera: list[str] = []
    engine: list[str] = []
    seen: dict[str, tuple[str, str | None]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            engine += args[i + 1 :]
            break
        name = arg.partition("=")[0]
        if name in taken:
            value, i = _value(args, i, taken[name])
            _record(seen, name, name, value)
            infera += [name] if value is None else [name, value]
        elif name in aliases:
            alias = aliases[name]
            value, i = _value(args, i, alias.takes_value)
            translated = _translate(name, value, alias)
            if translated:
                _record(seen, alias.target, name, translated[1] if len(translated) > 1 else None)
            infera += translated
        else:
            engine.append(arg)
            i += 1
    return infera, engine


def adopt_option_aliases(
    engine_args: list[str],
    aliases: Mapping[str, FlagAlias],
    option_flags: Mapping[str, str],
    options: dict[str, Any],
) -> list[str]:
    """Move aliased adapter options out of the engine flags (after ``--``) into ``options``.

    ``option_flags`` maps an adapter option's flag (``--block-size``) to its name
    (``block_size``). Flags aliasing an Infera setting that is not an adapter option
    (``--port``) stay, for the adapter to refuse with the flag to use instead; aliases
    Infera always does (``--enable-kv-events``) are dropped. A value that contradicts an
    option given as an Infera flag is one clear error.
    """
    rest: list[str] = []
    i = 0
    while i < len(engine_args):
        name = engine_args[i].partition("=")[0]
        alias = aliases.get(name)
        if alias is None or (alias.target and alias.target not in option_flags):
            rest.append(engine_args[i])
            i += 1
            continue
        value, i = _value(engine_args, i, alias.takes_value)
        translated = _translate(name, value, alias)
        if not translated:
            continue
        key = option_flags[alias.target]
        new: Any = True if len(translated) == 1 else translated[1]
        old = options.get(key)
        if old is not None and str(old) != str(new):
            raise ConfigError(f"conflicting flags: {alias.target} {old} and {name} {value} (after --)")
        options[key] = new
    return rest


def launch_options(
    adapter: EngineAdapter, given: Mapping[str, Any], engine_args: list[str]
) -> tuple[dict[str, Any], list[str]]:
    """The adapter's options (defaults, then ``given``, then flags after ``--``) and the engine flags left.

    After ``--``, an adapter option's own flag (``--block-size 32``, a third-party engine's
    ``--command …``) and the adapter's aliases (:class:`FlagAlias`) set the option, so
    ``infera-run up … -- <engine flags>`` reaches every option ``worker`` has.
    """
    declared = {o.flag: o for o in adapter.options()}
    aliases: dict[str, FlagAlias] = {f: FlagAlias(f, takes_value=not o.is_flag) for f, o in declared.items()}
    aliases.update(adapter.flag_aliases() if isinstance(adapter, FlagAliases) else {})
    options = {k: v for k, v in given.items() if v is not None}
    adopted: dict[str, Any] = {}
    rest = adopt_option_aliases(engine_args, aliases, {f: o.name for f, o in declared.items()}, adopted)
    for flag, opt in declared.items():
        if opt.name not in adopted:
            continue
        value = adopted[opt.name]
        if isinstance(value, str) and opt.type in (int, float):
            try:
                value = opt.type(value)
            except ValueError:
                raise ConfigError(f"{flag} {value}: expected a number (after --)") from None
        old = options.get(opt.name)
        if old is not None and str(old) != str(value):
            raise ConfigError(f"conflicting flags: {flag} {old} and {flag} {value} (after --)")
        options[opt.name] = value
    return {**{o.name: o.default for o in adapter.options()}, **options}, rest

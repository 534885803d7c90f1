"""Configuration: pydantic-settings models exposed as click options.

Precedence for every setting: CLI flag > ``INFERA_*`` environment variable > config
file (``--config FILE``, YAML or JSON) > default. Each command declares a settings
model; :func:`click_options` turns its fields into flags whose ``--help`` names the
env var, and :func:`resolve` builds the model with that precedence.

Field metadata: ``Field(description=...)`` is the help text; put
``json_schema_extra={"flag": "--x", "short": "-x", "aliases": ["--old-x"], "cli": False}``
to rename, alias or hide. The environment variable is ``INFERA_<FIELD>`` unless the field
says ``"env": "INFERA_X"``; ``"old_env": ["INFERA_OLD"]`` are read after it (with one
deprecation line each, naming the new one) and ``"old_keys": ["old_name"]`` likewise in a
config file. One variable name means one thing in every command (docs/configuration.md).

Plugins add settings too: discovery backends and transports declare a ``settings_model``
(see :mod:`infera_core.config.backends`); :func:`compose_settings` makes a command's model with
their fields added, and :class:`SettingsCommand` shows them as options of that command.
"""

from __future__ import annotations

import json
import logging
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

import click
import yaml
from pydantic import BaseModel, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from infera_core.errors import ConfigError

S = TypeVar("S", bound="InferaSettings")
B = TypeVar("B", bound=BaseModel)
F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("infera.config")

_warned: set[tuple[str, str]] = set()


def _extra(info: FieldInfo | None) -> dict[str, Any]:
    extra = info.json_schema_extra if info is not None else None
    return extra if isinstance(extra, dict) else {}


def _names(info: FieldInfo | None, key: str) -> list[str]:
    found = _extra(info).get(key)
    return [str(n) for n in found] if isinstance(found, list) else []


def deprecated_name(old: str, new: str) -> None:
    """One warning line per process that ``old`` (a variable or config key) is read as ``new``."""
    if (old, new) not in _warned:
        _warned.add((old, new))
        log.warning("%s is deprecated: use %s (the old name is still read, for now)", old, new)


class _EnvSource(EnvSettingsSource):
    """The ``INFERA_*`` environment: each field's own name (:func:`env_name`) first, then
    its ``old_env`` names with a deprecation line."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        value, key, is_complex = super().get_field_value(field, field_name)
        names = env_names(field_name, field)
        if names == ("INFERA_" + field_name.upper(),):
            return value, key, is_complex
        for i, name in enumerate(names):
            found = self.env_vars.get(name if self.case_sensitive else name.lower())
            if found is not None:
                if i:
                    deprecated_name(name, names[0])
                return found, key, is_complex
        return None, key, is_complex


class _FileSource(PydanticBaseSettingsSource):
    """Values from a YAML/JSON config file (lower priority than env)."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        fields = self.settings_cls.model_fields
        out = {k: v for k, v in self._data.items() if k in fields}
        for name, info in fields.items():
            for old in _names(info, "old_keys"):
                if name not in out and old in self._data:
                    deprecated_name(f"config key {old!r}", repr(name))
                    out[name] = self._data[old]
        return out


class InferaSettings(BaseSettings):
    """Base for command settings: ``INFERA_`` env prefix, unknown env ignored."""

    model_config = SettingsConfigDict(env_prefix="INFERA_", extra="ignore", env_nested_delimiter="__")

    _file_data: typing.ClassVar[dict[str, Any]] = {}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        file_data = init_settings.init_kwargs.pop("_config_file_data", {})  # type: ignore[attr-defined]
        return (init_settings, _EnvSource(settings_cls), _FileSource(settings_cls, file_data))


def env_names(field_name: str, info: FieldInfo | None = None) -> tuple[str, ...]:
    """The variables a setting reads, in order: its own, then deprecated spellings."""
    own = _extra(info).get("env")
    return (str(own) if own else "INFERA_" + field_name.upper(), *_names(info, "old_env"))


def env_name(field_name: str, info: FieldInfo | None = None) -> str:
    """The environment variable of a setting (``--help`` shows it)."""
    return env_names(field_name, info)[0]


def _flag_name(name: str, info: FieldInfo) -> str:
    flag = _extra(info).get("flag")
    return str(flag) if flag else "--" + name.replace("_", "-")


def _unwrap_optional(tp: Any) -> Any:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _click_type(tp: Any) -> tuple[Any, bool, bool]:
    """(click type, is_flag, multiple)."""
    tp = _unwrap_optional(tp)
    origin = get_origin(tp)
    if tp is bool:
        return bool, True, False
    if origin is list:
        inner = get_args(tp)[0] if get_args(tp) else str
        return _click_type(inner)[0], False, True
    if origin is typing.Literal:
        return click.Choice([str(a) for a in get_args(tp)]), False, False
    if isinstance(tp, type) and issubclass(tp, Enum):
        return click.Choice([str(m.value) for m in tp]), False, False
    if tp in (int, float, str):
        return tp, False, False
    if tp is Path:
        return click.Path(path_type=Path), False, False
    return str, False, False


def field_options(fields: Iterable[tuple[str, FieldInfo]]) -> list[click.Option]:
    """One click option per settings field (``--help`` shows the env var), in order."""
    out: list[click.Option] = []
    for name, info in fields:
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if extra.get("cli") is False:
            continue
        ctype, is_flag, multiple = _click_type(info.annotation)
        default = info.default if info.default is not None and not callable(info.default) else None
        shown = "" if default in (None, "", [], False) else f" [default: {default}]"
        if isinstance(default, Enum):
            shown = f" [default: {default.value}]"
        help_text = f"{info.description or ''}{shown} [env: {env_name(name, info)}]".strip()
        decls = [_flag_name(name, info)]
        if extra.get("short"):
            decls.append(str(extra["short"]))
        if is_flag:
            decls = [f"{decls[0]}/--no-{decls[0][2:]}"]
        aliases = extra.get("aliases")
        if isinstance(aliases, list):
            decls += [str(a) for a in aliases]
        out.append(
            click.Option(
                [*decls, name],
                type=None if is_flag else ctype,
                is_flag=is_flag,
                default=None,
                multiple=multiple,
                help=help_text,
            )
        )
    return out


def click_options(model: type[BaseModel]) -> Callable[[F], F]:
    """Decorator adding one click option per settings field (``--help`` shows the env var)."""

    def decorate(fn: F) -> F:
        params = getattr(fn, "__click_params__", None)
        if params is None:
            params = []
            fn.__click_params__ = params  # type: ignore[attr-defined]
        # click applies decorators bottom-up and reverses __click_params__ at the end
        params.extend(reversed(field_options(model.model_fields.items())))
        return fn

    return decorate


def read_data_file(path: str | Path, flag: str) -> Any:
    """The YAML (JSON when the name ends in ``.json``) document in ``path``; a
    :class:`ConfigError` naming ``flag`` when it cannot be read or parsed."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{flag} {p}: cannot read file ({exc.strerror})") from None
    try:
        return json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"{flag} {p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {exc}"
        ) from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    data = read_data_file(p, "--config")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {p}: expected a mapping of setting names to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def resolve(
    model: type[S],
    cli_values: dict[str, Any],
    config_file: str | Path | None = None,
) -> S:
    """Build ``model`` with precedence CLI > env > config file > default.

    ``cli_values`` are the click parameters; only those not None (or non-empty for
    multi-value options) count as given on the command line.
    """
    given = {k: v for k, v in cli_values.items() if k in model.model_fields and v is not None and v != ()}
    for k, v in list(given.items()):
        if isinstance(v, tuple):
            given[k] = list(v)
    file_data = read_config_file(config_file) if config_file else {}
    try:
        return model(**given, _config_file_data=file_data)
    except ValidationError as exc:
        raise ConfigError(_explain(model, exc)) from None
    except SettingsError as exc:  # an env var a list/dict field cannot parse (it wants JSON)
        raise ConfigError(
            f'{exc} (list settings take JSON in the environment, e.g. \'["a", "b"]\')'
        ) from None


def _explain(model: type[BaseModel], exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = err.get("loc") or ("?",)
    name = str(loc[0])
    info = model.model_fields.get(name)
    flag = _flag_name(name, info) if info is not None else name
    return (
        f"{flag} (env {env_name(name, info)}): {err.get('msg', 'invalid value')} (got {err.get('input')!r})"
    )


def config_option(fn: F) -> F:
    """The ``--config FILE`` option every settings-driven command takes (parameter ``config_file``)."""
    return click.option(
        "--config",
        "config_file",
        type=click.Path(path_type=Path),
        default=None,
        help="YAML/JSON file of settings (lower priority than flags and env). [env: INFERA_CONFIG]",
        envvar="INFERA_CONFIG",
    )(fn)


_composed: dict[tuple[type[BaseModel], tuple[type[BaseModel], ...]], type[BaseModel]] = {}


def compose_settings(base: type[B], extra: Sequence[type[BaseModel]]) -> type[B]:
    """``base`` plus the fields of ``extra`` models it does not have (plugin backends' settings).

    Two extra models declaring one field name with different types is a
    :class:`ConfigError` naming both. The result is cached per (base, extra).
    """
    key = (base, tuple(extra))
    found = _composed.get(key)
    if found is None:
        fields: dict[str, Any] = {}
        owners: dict[str, type[BaseModel]] = {}
        for model in extra:
            for name, info in model.model_fields.items():
                if name in base.model_fields:
                    continue
                if name in fields:
                    if fields[name][0] != info.annotation:
                        raise ConfigError(
                            f"setting {name!r} is declared by {owners[name].__name__} and "
                            f"{model.__name__} with different types"
                        )
                    continue
                fields[name] = (info.annotation, info)
                owners[name] = model
        found = create_model(base.__name__, __base__=base, __doc__=base.__doc__, **fields) if fields else base
        _composed[key] = found
    return typing.cast("type[B]", found)

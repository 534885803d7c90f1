"""Plugin loading: iterate the ``infera`` entry-point group ourselves.

pluggy's own ``load_setuptools_entrypoints`` stops at the first plugin that fails
to import; here a broken plugin is logged (with its distribution and traceback)
and skipped, unless strict mode makes it fatal. Nothing happens at import time:
call :func:`make_plugin_manager`.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import os
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal

import pluggy

from infera_core.errors import PluginError
from infera_core.plugin import spec as hookspecs

log = logging.getLogger("infera.plugins")

ENTRY_POINT_GROUP = "infera"

Status = Literal["ok", "failed", "disabled"]


@dataclass(slots=True)
class PluginInfo:
    """What ``infera-run plugins`` reports about one plugin."""

    name: str
    distribution: str | None
    version: str | None
    status: Status
    module: str | None = None
    error: str | None = None
    traceback: str | None = None
    provides: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self, with_traceback: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "module": self.module,
            "provides": self.provides,
        }
        if self.error:
            out["error"] = self.error
        if with_traceback and self.traceback:
            out["traceback"] = self.traceback
        return out


@dataclass(slots=True)
class PluginManager:
    """A pluggy manager plus what we learned while loading plugins."""

    pm: pluggy.PluginManager
    infos: list[PluginInfo]

    def info(self, name: str) -> PluginInfo | None:
        return next((i for i in self.infos if i.name == name), None)

    def failed(self) -> list[PluginInfo]:
        return [i for i in self.infos if i.status == "failed"]


def _env_list(name: str) -> list[str] | None:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    return [p.strip() for p in raw.split(",") if p.strip()]


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _dist_of(ep: EntryPoint) -> tuple[str | None, str | None]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    return dist.metadata["Name"], dist.version


def _check_hook_names(pm: pluggy.PluginManager, name: str) -> None:
    """pluggy's ``check_pending()`` for plugin ``name``: every hookimpl must match a hookspec.

    A misspelt hook (``infera_register_engine``) would otherwise never be called; the
    error names the hook and the closest real one.
    """
    plugin = pm.get_plugin(name)
    for caller in pm.get_hookcallers(plugin) or []:
        if caller.has_spec() or all(i.optionalhook for i in caller.get_hookimpls() if i.plugin is plugin):
            continue
        specs = [n for n, c in vars(pm.hook).items() if not n.startswith("_") and c.has_spec()]
        close = difflib.get_close_matches(caller.name, specs, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise PluginError(f"hook implementation {caller.name!r} matches no infera hook{hint}")


def make_plugin_manager(
    *,
    strict: bool | None = None,
    disable: Sequence[str] | None = None,
    load_only: Sequence[str] | None = None,
    extra_plugins: Iterable[tuple[str, object]] = (),
    eps: Iterable[EntryPoint] | None = None,
) -> PluginManager:
    """Build a plugin manager with every installed ``infera`` plugin.

    ``strict`` / ``disable`` / ``load_only`` default to ``INFERA_STRICT_PLUGINS``,
    ``INFERA_DISABLE_PLUGINS`` and ``INFERA_LOAD_PLUGINS``. ``extra_plugins`` are
    (name, object) pairs registered as if they came from an entry point (tests).
    ``eps`` replaces the installed entry points (tests). In strict mode a plugin
    that fails to import raises :class:`PluginError` naming it.
    """
    if strict is None:
        strict = _env_flag("INFERA_STRICT_PLUGINS")
    disabled = set(disable if disable is not None else (_env_list("INFERA_DISABLE_PLUGINS") or []))
    only = load_only if load_only is not None else _env_list("INFERA_LOAD_PLUGINS")
    only_set = set(only) if only is not None else None

    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    infos: list[PluginInfo] = []
    seen: set[str] = set()

    found = list(eps) if eps is not None else list(entry_points(group=ENTRY_POINT_GROUP))
    for ep in sorted(found, key=lambda e: (e.name != "core", e.name)):
        if ep.name in seen:
            continue
        seen.add(ep.name)
        dist, version = _dist_of(ep)
        if ep.name in disabled or (only_set is not None and ep.name not in only_set and ep.name != "core"):
            infos.append(PluginInfo(ep.name, dist, version, "disabled", module=ep.value))
            continue
        try:
            obj = ep.load()
            pm.register(obj, name=ep.name)
            _check_hook_names(pm, ep.name)
        except Exception as exc:
            if pm.has_plugin(ep.name):
                pm.unregister(name=ep.name)
            tb = traceback.format_exc()
            msg = f"{type(exc).__name__}: {exc}"
            if strict:
                raise PluginError(
                    f"plugin {ep.name!r} (distribution {dist or '?'}) failed to load: {msg}"
                ) from exc
            log.warning("plugin %r (distribution %s) failed to load, skipped: %s\n%s", ep.name, dist, msg, tb)
            infos.append(PluginInfo(ep.name, dist, version, "failed", ep.value, msg, tb))
            continue
        infos.append(PluginInfo(ep.name, dist, version, "ok", module=ep.value))

    for name, obj in extra_plugins:
        if isinstance(obj, str):
            obj = importlib.import_module(obj)
        pm.register(obj, name=name)
        try:
            _check_hook_names(pm, name)
        except PluginError as exc:
            raise PluginError(f"plugin {name!r} failed to load: {exc}") from None
        infos.append(PluginInfo(name, None, None, "ok", module=getattr(obj, "__name__", repr(obj))))
    return PluginManager(pm, infos)

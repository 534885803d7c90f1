"""Settings composed with the installed backends' own settings models.

Discovery backends and transports declare a ``settings_model``; commands that use them
take those fields as options too. Composing needs the plugin catalog, so it lives here,
above the settings machinery (:mod:`infera_core.config`) that knows no plugins.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import click
from pydantic import BaseModel

from infera_core.config.backends import settings_model_of
from infera_core.config.settings import compose_settings, field_options
from infera_core.discovery.base import DiscoveryRegistry
from infera_core.engines.settings import WorkerSettings
from infera_core.transports.base import KvEventTransportRegistry, RequestTransportRegistry

M = TypeVar("M", bound=BaseModel)
B = TypeVar("B", bound=BaseModel)


class BackendCatalog(Protocol):
    """The part of the plugin catalog whose entries declare settings
    (:meth:`infera_core.plugin.hooks.InferaHooks.catalog` returns one)."""

    @property
    def discovery(self) -> DiscoveryRegistry: ...

    @property
    def request_transports(self) -> RequestTransportRegistry: ...

    @property
    def kv_event_transports(self) -> KvEventTransportRegistry: ...


def backend_models(catalog: BackendCatalog) -> list[type[BaseModel]]:
    """Every distinct settings model declared by installed discovery backends and transports."""
    out: list[type[BaseModel]] = []
    for registry in (catalog.discovery, catalog.request_transports, catalog.kv_event_transports):
        for entry in registry.entries():
            model = settings_model_of(entry.obj)
            if model is not None and model not in out:
                out.append(model)
    return out


def with_backend_fields(model: type[M], catalog: BackendCatalog, source: object, /, **values: Any) -> M:
    """``model(**values)`` composed with the installed backends' settings, whose values are
    copied from ``source`` (e.g. ``up`` handing its ``--nats-url`` to its server and workers)."""
    composed = compose_settings(model, backend_models(catalog))
    carried = {
        name: getattr(source, name)
        for name in composed.model_fields
        if name not in model.model_fields and hasattr(source, name)
    }
    return composed(**{**carried, **values})


class SettingsCommand(click.Command):
    """A command that also takes the plugin backends' settings (shown in ``--help``).

    ``base`` is the command's own settings model; the fields of every installed discovery
    backend's and transport's ``settings_model`` that ``base`` lacks are added as options
    when the command parses its arguments (the ``InferaHooks`` context object gives the
    catalog). The callback resolves them with
    ``resolve(command_settings(ctx, base), values, config_file)``.
    """

    def __init__(self, *args: Any, base: type[BaseModel], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.base = base

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        model = command_settings(ctx, self.base)
        if model is self.base:
            return params
        taken = {p.name for p in params}
        extra = [(n, f) for n, f in model.model_fields.items() if n not in taken]
        help_at = next((i for i, p in enumerate(params) if p.name == "help"), len(params))
        return [*params[:help_at], *field_options(extra), *params[help_at:]]


def command_settings(ctx: click.Context | None, base: type[B]) -> type[B]:
    """``base`` composed with the installed backends' settings (``base`` without a catalog)."""
    catalog = getattr(ctx.obj if ctx is not None else None, "catalog", None)
    if not callable(catalog):
        return base
    return compose_settings(base, backend_models(catalog()))


def launcher_flags(catalog: BackendCatalog | None = None) -> dict[str, str]:
    """Every flag ``infera-run worker <engine>`` has of its own, mapped to the setting it sets.

    With a catalog (``hooks.catalog()``), the flags of the installed discovery backends and
    transports are included. An :class:`~infera_core.engines.base.EngineOption` spelled like one of
    these (``port``, ``model``, ``role``…) would be shadowed by Infera's flag: the catalog
    refuses its plugin at load (:meth:`~infera_core.registry.EngineRegistry.check_options`),
    and the contract kit fails it.
    """
    model = (
        compose_settings(WorkerSettings, backend_models(catalog)) if catalog is not None else WorkerSettings
    )
    flags = {"--config": "config", "--help": "help"}
    for option in field_options(model.model_fields.items()):
        for spelled in (*option.opts, *option.secondary_opts):
            flags[spelled] = option.name or ""
    return flags

"""A typed facade over the pluggy hooks, and the catalog built from the catalog hooks.

Core code calls :class:`InferaHooks` methods (type-checked) instead of
``pm.hook.<name>(...)``. Catalog hooks are called one implementation at a time with
a registry bound to that plugin, so duplicates name both owners.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from infera_core.discovery.base import DiscoveryRegistry
from infera_core.engines.base import EngineRegistry
from infera_core.engines.pd import PdTransportRegistry
from infera_core.engines.transfer import TransferConnectorRegistry
from infera_core.errors import PluginError, UnknownNameError
from infera_core.kv.events import KvDecoderRegistry
from infera_core.plugin.loader import PluginManager, make_plugin_manager
from infera_core.plugin.settings import launcher_flags
from infera_core.registry import Registry
from infera_core.scheduling.registry import PolicyRegistry, Preset
from infera_core.tokenize.base import TokenizerRegistry
from infera_core.transports.base import KvEventTransportRegistry, RequestTransportRegistry

if TYPE_CHECKING:
    import click

    from infera_core.discovery.base import DiscoveryFactory
    from infera_core.engines.base import EngineAdapter, LaunchContext, LaunchSpec
    from infera_core.engines.pd import PdTransport
    from infera_core.engines.transfer import TransferConnector, TransferPlan
    from infera_core.kv.events import KvEventDecoder
    from infera_core.scheduling.types import PolicyFactory, RoutedEvent
    from infera_core.tokenize.base import TokenizerFactory
    from infera_core.transports.base import KvEventTransportFactory, RequestTransportFactory
    from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.hooks")

R = TypeVar("R", bound=Registry[Any])

RequireKind = Literal[
    "engine",
    "kv_event_decoder",
    "pd_transport",
    "discovery_backend",
    "tokenizer",
    "request_transport",
    "kv_event_transport",
    "filter",
    "scorer",
    "picker",
    "preset",
]
"""What :meth:`InferaHooks.require` can look up."""


@dataclass(slots=True)
class Catalog:
    """Everything the installed plugins provide, by name."""

    engines: EngineRegistry
    kv_decoders: KvDecoderRegistry
    pd_transports: PdTransportRegistry
    policies: PolicyRegistry
    discovery: DiscoveryRegistry
    tokenizers: TokenizerRegistry
    request_transports: RequestTransportRegistry
    kv_event_transports: KvEventTransportRegistry
    transfer_connectors: TransferConnectorRegistry

    def registries(self) -> list[Registry[Any]]:
        return [
            self.engines,
            self.kv_decoders,
            self.pd_transports,
            self.policies,
            self.discovery,
            self.tokenizers,
            self.request_transports,
            self.kv_event_transports,
            self.transfer_connectors,
        ]

    def provides(self) -> dict[str, dict[str, list[str]]]:
        """plugin name → {kind → [names]} for ``infera-run plugins``."""
        out: dict[str, dict[str, list[str]]] = {}
        groups: list[tuple[str, Registry[Any]]] = [
            ("engines", self.engines),
            ("kv_event_decoders", self.kv_decoders),
            ("pd_transports", self.pd_transports),
            ("policies", self.policies),
            ("discovery_backends", self.discovery),
            ("tokenizers", self.tokenizers),
            ("request_transports", self.request_transports),
            ("kv_event_transports", self.kv_event_transports),
            ("transfer_connectors", self.transfer_connectors),
        ]
        for kind, reg in groups:
            for entry in reg.entries():
                out.setdefault(entry.owner, {}).setdefault(kind, []).append(entry.name)
        for preset in self.policies.preset_entries():
            out.setdefault(preset.owner, {}).setdefault("presets", []).append(preset.name)
        return out


class InferaHooks:
    """One typed method per hook."""

    def __init__(self, plugins: PluginManager) -> None:
        self.plugins = plugins
        self.pm = plugins.pm
        self._catalog: Catalog | None = None

    @classmethod
    def load(cls, **kwargs: Any) -> InferaHooks:
        """Load installed plugins (see :func:`make_plugin_manager` for arguments)."""
        return cls(make_plugin_manager(**kwargs))

    # -- catalog hooks -------------------------------------------------------
    def _collect(self, hook_name: str, registry: R) -> R:
        hook = getattr(self.pm.hook, hook_name)
        for impl in reversed(hook.get_hookimpls()):  # registration order
            bound = registry.bound(impl.plugin_name)
            try:
                impl.function(*[{"registry": bound}[a] for a in impl.argnames])
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(f"plugin {impl.plugin_name!r} failed in {hook_name}: {exc}") from exc
        return registry

    def catalog(self) -> Catalog:
        """Build (once) every registry from the catalog hooks."""
        if self._catalog is None:
            catalog = Catalog(
                engines=self._collect("infera_register_engines", EngineRegistry()),
                kv_decoders=self._collect("infera_register_kv_event_decoders", KvDecoderRegistry()),
                pd_transports=self._collect("infera_register_pd_transports", PdTransportRegistry()),
                policies=self._collect("infera_register_policies", PolicyRegistry()),
                discovery=self._collect("infera_register_discovery_backends", DiscoveryRegistry()),
                tokenizers=self._collect("infera_register_tokenizers", TokenizerRegistry()),
                request_transports=self._collect(
                    "infera_register_request_transports", RequestTransportRegistry()
                ),
                kv_event_transports=self._collect(
                    "infera_register_kv_event_transports", KvEventTransportRegistry()
                ),
                transfer_connectors=self._collect(
                    "infera_register_transfer_connectors", TransferConnectorRegistry()
                ),
            )
            # an engine option spelled like a launcher flag could never be set: refused here,
            # once the backends (which add launcher flags) are collected too
            catalog.engines.check_options(
                launcher_flags(catalog), {i.name: i.distribution for i in self.plugins.infos}
            )
            # lookups made straight on a registry (a router config's presets and policy
            # names, transports…) name the failed plugins too, as require() does
            problems = self.plugin_problems()
            for reg in catalog.registries():
                reg.note = problems
            self._catalog = catalog
        return self._catalog

    # -- explicit requests -----------------------------------------------------
    @overload
    def require(self, kind: Literal["engine"], name: str) -> EngineAdapter: ...
    @overload
    def require(self, kind: Literal["kv_event_decoder"], name: str) -> KvEventDecoder: ...
    @overload
    def require(self, kind: Literal["pd_transport"], name: str) -> PdTransport: ...
    @overload
    def require(self, kind: Literal["discovery_backend"], name: str) -> DiscoveryFactory: ...
    @overload
    def require(self, kind: Literal["tokenizer"], name: str) -> TokenizerFactory: ...
    @overload
    def require(self, kind: Literal["request_transport"], name: str) -> RequestTransportFactory: ...
    @overload
    def require(self, kind: Literal["kv_event_transport"], name: str) -> KvEventTransportFactory: ...
    @overload
    def require(self, kind: Literal["filter", "scorer", "picker"], name: str) -> PolicyFactory: ...
    @overload
    def require(self, kind: Literal["preset"], name: str) -> Preset: ...

    def require(self, kind: RequireKind, name: str) -> object:
        """The object a user explicitly asked for (``--engine``, ``--router-policy``…).

        Raises :class:`UnknownNameError` when no loaded plugin provides ``name``: the
        message lists what is available and names every plugin that failed to load
        (with its error) or was disabled, since the name may have come from one of them.
        """
        catalog = self.catalog()
        try:
            if kind in ("filter", "scorer", "picker"):
                return catalog.policies.factory(kind, name)
            if kind == "preset":
                return catalog.policies.preset(name)
            registries: dict[str, Registry[Any]] = {
                "engine": catalog.engines,
                "kv_event_decoder": catalog.kv_decoders,
                "pd_transport": catalog.pd_transports,
                "discovery_backend": catalog.discovery,
                "tokenizer": catalog.tokenizers,
                "request_transport": catalog.request_transports,
                "kv_event_transport": catalog.kv_event_transports,
            }
            if kind not in registries:
                raise ValueError(f"require(): unknown kind {kind!r}")
            return registries[kind].get(name)
        except UnknownNameError as exc:
            raise UnknownNameError(exc.kind, name, exc.available, self.plugin_problems()) from None

    def plugin_problems(self) -> str:
        """One line about plugins that failed to load or were disabled ('' when none)."""
        parts = [
            f"plugin {i.name!r} (distribution {i.distribution or '?'}) failed to load: {i.error}"
            for i in self.plugins.failed()
        ]
        disabled = [i.name for i in self.plugins.infos if i.status == "disabled"]
        if disabled:
            parts.append(
                "disabled by INFERA_DISABLE_PLUGINS/INFERA_LOAD_PLUGINS: " + ", ".join(sorted(disabled))
            )
        return "; ".join(parts)

    def register_commands(self, cli: click.Group) -> None:
        self._broadcast("infera_register_commands", strict=True, cli=cli)

    # -- broadcast hooks -----------------------------------------------------
    def _broadcast(self, hook_name: str, strict: bool = False, **kwargs: Any) -> None:
        hook = getattr(self.pm.hook, hook_name)
        for impl in reversed(hook.get_hookimpls()):
            try:
                impl.function(*[kwargs[a] for a in impl.argnames])
            except Exception as exc:
                if strict:
                    raise PluginError(f"plugin {impl.plugin_name!r} failed in {hook_name}: {exc}") from exc
                log.exception("plugin %r failed in %s (ignored)", impl.plugin_name, hook_name)

    def has_impl(self, hook_name: str) -> bool:
        return bool(getattr(self.pm.hook, hook_name).get_hookimpls())

    def mutate_engine_launch(self, context: LaunchContext, spec: LaunchSpec) -> None:
        """Let every plugin adjust the engine argv/env. A failure here is fatal (bad launch)."""
        self._broadcast("infera_mutate_engine_launch", strict=True, context=context, spec=spec)

    def transfer_connectors(self, engine: str) -> dict[str, TransferConnector]:
        """The KV transfer connectors plugins registered for ``engine``, by name."""
        return self.catalog().transfer_connectors.for_engine(engine)

    def amend_kv_transfer(self, context: LaunchContext, plan: TransferPlan) -> None:
        """Let every plugin amend a launch's KV transfer plan. A failure here is fatal (bad launch)."""
        self._broadcast("infera_amend_kv_transfer", strict=True, context=context, plan=plan)

    def worker_added(self, record: WorkerRecord) -> None:
        self._broadcast("infera_worker_added", record=record)

    def worker_removed(self, record: WorkerRecord) -> None:
        self._broadcast("infera_worker_removed", record=record)

    def request_routed_notifier(self) -> Callable[[RoutedEvent], None] | None:
        """A callable for the hot path, or None when no plugin listens (zero cost)."""
        if not self.has_impl("infera_request_routed"):
            return None

        def notify(event: RoutedEvent) -> None:
            self._broadcast("infera_request_routed", event=event)

        return notify

"""The old documented import paths still give the same objects (re-exports kept for one release)."""

from __future__ import annotations

import importlib

import pytest

OLD_NEW = [
    ("infera_core.engine", "infera_core.engines.base", "LaunchContext"),
    ("infera_core.engine", "infera_core.engines.base", "EngineAdapter"),
    ("infera_core.transfer", "infera_core.engines.transfer", "resolve_plan"),
    ("infera_core.transfer", "infera_core.engines.base", "TransferConnectorRegistry"),
    ("infera_core.pd", "infera_core.engines.pd", "PdTransport"),
    ("infera_core.pd", "infera_core.engines.pd", "KvTransferParamsLegs"),
    ("infera_core.engine_support", "infera_core.engines.support", "free_ports"),
    ("infera_core.transports", "infera_core.transports.base", "RequestTransportFactory"),
    ("infera_core.server.transport", "infera_core.transports.upstreams", "UpstreamError"),
    ("infera_core.server.transport", "infera_core.transports.clients", "Upstreams"),
    ("infera_core.hookspecs", "infera_core.plugin.spec", "hookimpl"),
    ("infera_core.plugins", "infera_core.plugin.loader", "make_plugin_manager"),
    ("infera_core.facade", "infera_core.plugin.hooks", "InferaHooks"),
    ("infera_core.settings", "infera_core.config.settings", "InferaSettings"),
    ("infera_core.backends", "infera_core.plugin.settings", "with_backend_fields"),
    ("infera_core.redact", "infera_core.util.redact", "redact_url"),
    ("infera_core.launcher.alias", "infera_core.cli.alias", "flat_main_for"),
    ("infera_core.launcher.settings", "infera_core.engines.settings", "WorkerSettings"),
    ("infera_core.testing.net", "infera_core.util.net", "free_port"),
    ("infera_core.registry", "infera_core.scheduling.registry", "PolicyRegistry"),
    ("infera_core.registry", "infera_core.engines.base", "EngineRegistry"),
    ("infera_core.registry", "infera_core.engines.pd", "PdTransportRegistry"),
    ("infera_core.scheduling.types", "infera_core.request", "RequestContext"),
]


@pytest.mark.parametrize(("old", "new", "name"), OLD_NEW)
def test_an_old_path_gives_the_new_object(old: str, new: str, name: str) -> None:
    assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(new), name)


def test_an_unknown_name_on_the_registry_module_is_an_attribute_error() -> None:
    registry = importlib.import_module("infera_core.registry")
    with pytest.raises(AttributeError, match="NoSuchRegistry"):
        registry.NoSuchRegistry  # noqa: B018


def test_pd_transport_is_the_pd_protocol() -> None:
    from infera_core.engines.pd import PdProtocol, PdProtocolRegistry, PdTransport, PdTransportRegistry

    assert PdTransport is PdProtocol and PdTransportRegistry is PdProtocolRegistry
    assert PdProtocolRegistry.kind == "PD protocol"

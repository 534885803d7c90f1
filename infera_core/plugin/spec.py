"""Hook specifications for Infera plugins (pluggy project name ``infera``).

Two kinds of hooks:

* **Catalog hooks** (``infera_register_*``) fire once, when a plugin manager is
  turned into a :class:`~infera_core.plugin.hooks.Catalog`. Each receives a typed
  registry already bound to the calling plugin's name; the plugin adds named
  objects to it. A name added twice fails at start-up, naming both owners.
* **Broadcast hooks** fire for every plugin that implements them: engine launch
  mutation, KV transfer amendment, and fleet / routing notifications. They return
  nothing. An exception in a notification is logged and does not stop the others; one
  in ``infera_mutate_engine_launch``, ``infera_amend_kv_transfer`` or
  ``infera_register_commands`` is fatal.

Core never calls ``pm.hook.*`` directly: it goes through
:class:`infera_core.plugin.hooks.InferaHooks`, which has one typed method per hook.
The reference, with an example per hook, is ``docs/reference/hooks.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import click

    from infera_core.discovery.base import DiscoveryRegistry
    from infera_core.engines.base import EngineRegistry, LaunchContext, LaunchSpec
    from infera_core.engines.pd import PdTransportRegistry
    from infera_core.engines.transfer import TransferConnectorRegistry, TransferPlan
    from infera_core.kv.events import KvDecoderRegistry
    from infera_core.scheduling.registry import PolicyRegistry
    from infera_core.scheduling.types import RoutedEvent
    from infera_core.tokenize.base import TokenizerRegistry
    from infera_core.transports.base import KvEventTransportRegistry, RequestTransportRegistry
    from infera_core.worker import WorkerRecord

PROJECT_NAME = "infera"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def infera_register_engines(registry: EngineRegistry) -> None:
    """Add engine adapters (objects satisfying :class:`infera_core.engines.base.EngineAdapter`).

    Fires once when the catalog is built (CLI start-up, server start-up, tests).
    Call ``registry.add(adapter)``; the adapter's ``name`` is what users pass to
    ``infera-run worker <engine>``. The adapter must not import its engine package.
    """


@hookspec
def infera_register_kv_event_decoders(registry: KvDecoderRegistry) -> None:
    """Add KV event decoders (:class:`infera_core.kv.events.KvEventDecoder`).

    Fires once when the catalog is built. The decoder's ``name`` is the value a
    worker record carries in ``kv_events.format``; the router's event hub looks the
    decoder up by that name for every worker that advertises KV events.
    """


@hookspec
def infera_register_pd_transports(registry: PdTransportRegistry) -> None:
    """Add prefill/decode transports (:class:`infera_core.engines.pd.PdTransport`).

    Fires once when the catalog is built. The transport's ``name`` is the value a
    worker record carries in ``pd.protocol``; the router uses it to shape the
    prefill and decode request bodies and to know their order (serial or concurrent).
    """


@hookspec
def infera_register_policies(registry: PolicyRegistry) -> None:
    """Add routing filters, scorers, pickers and named presets.

    Fires once when the catalog is built. Call ``registry.add(PolicyFactory(...))``
    for building blocks and ``registry.add_preset(name, profile, description)`` for
    named profiles selectable with ``--router-policy``. Factories are called when the
    scheduler is assembled from configuration, never per request.
    """


@hookspec
def infera_register_discovery_backends(registry: DiscoveryRegistry) -> None:
    """Add discovery backends (:class:`infera_core.discovery.base.DiscoveryFactory`).

    Fires once when the catalog is built. The factory's ``name`` is what users pass to
    ``--discovery-backend``. A backend both registers workers (launcher side) and watches
    the fleet (server side). A factory may declare ``settings_model`` (a pydantic model):
    its fields become flags and ``INFERA_*`` variables of the commands that take a
    discovery backend, and ``create`` reads them with ``settings.options.get(model)``.
    """


@hookspec
def infera_register_request_transports(registry: RequestTransportRegistry) -> None:
    """Add request transports (:class:`infera_core.transports.base.RequestTransportFactory`).

    Fires once when the catalog is built. The factory's ``name`` is what a worker record
    carries in ``request_transport`` and what users pass to ``--request-transport``. The
    router builds one client per transport (``create_client``) and sends every request to
    a worker through the client of the transport its record names; the launcher calls
    ``attach_worker`` to start the worker side (a responder), if any.
    """


@hookspec
def infera_register_kv_event_transports(registry: KvEventTransportRegistry) -> None:
    """Add KV-event transports (:class:`infera_core.transports.base.KvEventTransportFactory`).

    Fires once when the catalog is built. The factory's ``name`` is what a worker record
    carries in ``kv_event_transport`` and what users pass to ``--kv-event-transport``.
    The router's KV hub reads each worker's event batches through the source of that
    transport (``create_source``); the launcher calls ``attach_worker`` to start the
    worker side (a relay), if any.
    """


@hookspec
def infera_register_tokenizers(registry: TokenizerRegistry) -> None:
    """Add tokenizer factories (:class:`infera_core.tokenize.base.TokenizerFactory`).

    Fires once when the catalog is built. The router uses the tokenizer named in its
    configuration for a model to turn requests into token ids exactly as the engine
    does, so prompt block hashes match the engine's KV events.
    """


@hookspec
def infera_register_transfer_connectors(registry: TransferConnectorRegistry) -> None:
    """Add KV transfer connectors (:class:`infera_core.engines.transfer.TransferConnector`).

    Fires once when the catalog is built. A connector belongs to one engine
    (``connector.engine``) and is found by its Infera name (``--pd-connector``) or one of
    its engine spellings (``connector.native``: the ``kv_connector`` of the user's
    ``--kv-transfer-config``). For a prefill or decode launch the engine adapter asks it
    to ``build(ctx, user)`` a :class:`~infera_core.engines.transfer.TransferPlan`: the engine's
    transfer config, flags and environment, and the ``pd`` the worker record advertises.
    """


@hookspec
def infera_register_commands(cli: click.Group) -> None:
    """Add subcommands to the ``infera-run`` click group.

    Fires once when ``infera-run`` starts, after plugins are loaded. Call
    ``cli.add_command(cmd)``. Keep command modules cheap to import.
    """


@hookspec
def infera_mutate_engine_launch(context: LaunchContext, spec: LaunchSpec) -> None:
    """Adjust an engine's launch argv and environment before it starts.

    Fires in the worker launcher after the engine adapter has built ``spec`` and
    before the engine subprocess is spawned, once per plugin that implements it.
    Mutate ``spec.argv`` / ``spec.env`` in place; the return value is ignored.
    """


@hookspec
def infera_amend_kv_transfer(context: LaunchContext, plan: TransferPlan) -> None:
    """Adjust an engine's KV transfer plan (config, flags, env, advertised PD) before launch.

    Fires in the worker launcher once per launch, for every plugin that implements it,
    after the chosen connector built ``plan`` for ``context.role`` (also on mixed workers,
    where ``plan.connector`` is None and ``plan.config`` is the user's own config, if any).
    Mutate ``plan`` in place (e.g. ``plan.config["kv_connector_extra_config"][...]``,
    ``plan.env``); the return value is ignored. An exception is fatal (a bad launch).
    """


@hookspec
def infera_worker_added(record: WorkerRecord) -> None:
    """Notification: a worker joined the fleet view of this process (or changed).

    Fires in the server when discovery reports a new or updated worker record.
    Must return quickly and never block; the return value is ignored.
    """


@hookspec
def infera_worker_removed(record: WorkerRecord) -> None:
    """Notification: a worker left the fleet view of this process.

    Fires in the server when discovery reports a deletion (deregistration or lease
    expiry). Must return quickly and never block; the return value is ignored.
    """


@hookspec
def infera_request_routed(event: RoutedEvent) -> None:
    """Notification: the scheduler picked a worker (or a prefill/decode pair).

    Fires in the server after each routing decision, before the request is sent.
    Implementations must be cheap (it is on the hot path only when implemented) and
    never raise; the return value is ignored.
    """

"""Entry point of the ``infera-nats`` distribution (hook implementations).

Registers the ``nats`` discovery backend (:mod:`infera_nats.discovery`), request
transport and KV-event transport (:mod:`infera_nats.transport_factories`). All three
share :class:`infera_nats.settings.NatsSettings` (``--nats-url``, ``--nats-bucket``,
``--nats-subject-prefix``; ``INFERA_NATS_URL``…): one set of flags. The ``nats-layout``
command (:mod:`infera_nats.commands`) writes an authenticated plane's server configuration. Modules are imported
inside the hooks so loading the plugin stays cheap.
"""

from __future__ import annotations

import click

from infera_core.discovery.base import DiscoveryRegistry
from infera_core.plugin.spec import hookimpl
from infera_core.transports.base import KvEventTransportRegistry, RequestTransportRegistry


@hookimpl
def infera_register_discovery_backends(registry: DiscoveryRegistry) -> None:
    from infera_nats.discovery import NatsDiscoveryFactory

    registry.add(NatsDiscoveryFactory())


@hookimpl
def infera_register_request_transports(registry: RequestTransportRegistry) -> None:
    from infera_nats.transport_factories import NatsRequestTransport

    registry.add(NatsRequestTransport())


@hookimpl
def infera_register_kv_event_transports(registry: KvEventTransportRegistry) -> None:
    from infera_nats.transport_factories import NatsKvEventTransport

    registry.add(NatsKvEventTransport())


@hookimpl
def infera_register_commands(cli: click.Group) -> None:
    from infera_nats.commands import nats_layout

    cli.add_command(nats_layout)

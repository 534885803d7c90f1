"""Networking helpers: a free TCP port."""

from __future__ import annotations

import socket

WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")
"""Host spellings that mean every interface."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` (any interface for a wildcard host).

    The port is bound and released at once: another process may take it before the
    caller binds it, so this suits tests, local stacks and engine launch, not a server
    that must own its port (bind port 0 and keep the socket for that).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("" if host in WILDCARD_HOSTS else host, 0))
        return int(s.getsockname()[1])

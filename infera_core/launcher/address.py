"""Which address a worker advertises, and free ports for the engine."""

from __future__ import annotations

import ipaddress
import socket

from infera_core.util.net import WILDCARD_HOSTS
from infera_core.util.net import free_port as free_port  # re-exported: its old home


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    return host in WILDCARD_HOSTS


def primary_ip() -> str:
    """This machine's primary non-loopback IPv4 address (127.0.0.1 when it has none).

    Uses the routing table (a UDP ``connect`` sends nothing), then the hostname.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            ip = str(s.getsockname()[0])
            if not is_loopback(ip) and not is_wildcard(ip):
                return ip
        except OSError:
            pass
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            ip = str(info[4][0])
            if not is_loopback(ip):
                return ip
    except OSError:
        pass
    return "127.0.0.1"


def advertise_host(bind_host: str, explicit: str | None = None) -> str:
    """``explicit``, else 127.0.0.1 for a loopback bind, the bound IP, or the primary IP."""
    if explicit:
        return explicit
    if is_loopback(bind_host):
        return "127.0.0.1"
    if is_wildcard(bind_host):
        return primary_ip()
    return bind_host

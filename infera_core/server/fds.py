"""Open files: the soft ``RLIMIT_NOFILE`` raised to the hard one at start, and
``--max-connections`` capped to what the limit can hold.

systemd starts services with a soft limit of 1024 open files (and a hard one of 512 Ki): a
router at its default ``--max-connections 8192`` would run out of descriptors long before
its own cap, and a client beyond the limit is dropped by the kernel's accept queue with no
answer and nothing logged. So the server raises its soft limit to the hard one (any process
may), and when ``--max-connections`` still does not fit it is lowered, with one warning,
to the most client connections the limit holds: each may hold one connection to a worker
(up to ``--upstream-connections``), and ``RESERVE`` descriptors are kept for the rest
(discovery, KV-event sockets, logs). A client past the cap then gets a 503 and a log line.
"""

from __future__ import annotations

import logging
import resource
from typing import Protocol

log = logging.getLogger("infera.server")

RESERVE = 128
"""Descriptors kept for everything but client and worker connections."""


def raise_open_files_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (bounded by ``fs.nr_open`` when the
    hard one is unlimited); the soft limit in effect."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft


def connections_that_fit(max_connections: int, upstream_connections: int, open_files: int) -> int:
    """The most client connections (at most ``max_connections``) that ``open_files``
    descriptors hold, each client with one worker connection up to ``upstream_connections``."""
    room = open_files - RESERVE
    if max_connections + min(upstream_connections, max_connections) <= room:
        return max_connections
    fit = room // 2 if 2 * upstream_connections >= room else room - upstream_connections
    return max(1, min(max_connections, fit))


class ConnectionSettings(Protocol):
    """The two settings :func:`fit_connections` reads (``ServeSettings`` has both)."""

    max_connections: int
    upstream_connections: int


def fit_connections(settings: ConnectionSettings) -> None:
    """At start-up: raise the soft open-file limit, then lower ``settings.max_connections``
    (in place) to what fits, with one warning line when it had to."""
    open_files = raise_open_files_limit()
    if open_files == resource.RLIM_INFINITY:
        return
    wanted = settings.max_connections
    fit = connections_that_fit(wanted, settings.upstream_connections, open_files)
    if fit < wanted:
        log.warning(
            "--max-connections %d does not fit the open-file limit (RLIMIT_NOFILE %d): capped to %d"
            " (each client connection may hold one to a worker; %d kept for the rest). Raise the"
            " limit (ulimit -n, LimitNOFILE= in systemd) to serve more.",
            wanted,
            open_files,
            fit,
            RESERVE,
        )
        settings.max_connections = fit

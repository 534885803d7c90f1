"""When the launcher restarts a dead engine, and how long it waits first.

``--restart-engine on-failure`` restarts an engine that died (or stopped answering
``/health``) after it had served, waiting ``--restart-backoff`` seconds before the first
restart and twice as long before each further one in a row (at most
:data:`BACKOFF_CAP`). After ``--max-restarts`` restarts in a row the launcher gives up
and exits with the engine's error; an engine that served for :data:`STABLE_AFTER`
seconds resets the count.
"""

from __future__ import annotations

from enum import StrEnum

from infera_core.engines.settings import RestartPolicy, WorkerSettings

BACKOFF_CAP = 30.0
STABLE_AFTER = 60.0


class WorkerState(StrEnum):
    """Where one launcher is in its lifecycle (``infera-run up`` shows it)."""

    STARTING = "starting"
    SERVING = "serving"
    UNHEALTHY = "unhealthy"
    """Serving /health but failing generation checks: published as draining."""
    RESTARTING = "restarting"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


class RestartBudget:
    """Counts restarts in a row and hands out backoff delays."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.policy = settings.restart_engine
        self.max_restarts = settings.max_restarts
        self.backoff = settings.restart_backoff
        self.in_a_row = 0
        self.total = 0

    def served(self, seconds: float) -> None:
        """The engine served this long before it went down."""
        if seconds >= STABLE_AFTER:
            self.in_a_row = 0

    def next_delay(self) -> float | None:
        """Seconds to wait before the next restart, or None: do not restart."""
        if self.policy is RestartPolicy.NEVER or self.in_a_row >= self.max_restarts:
            return None
        delay: float = min(BACKOFF_CAP, self.backoff * 2.0**self.in_a_row)
        self.in_a_row += 1
        self.total += 1
        return delay

"""The drain wait: once a worker is published ``draining``, wait until its engine has no
request in flight (or ``--drain-timeout`` passes, or a second stop request skips the wait)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from infera_core.engines.base import EngineAdapter, RunningEngine
from infera_core.launcher.waits import first_of, quietly

log = logging.getLogger("infera.launcher")

DRAIN_POLL = 0.25
DRAIN_SETTLE = 1.0
"""After publishing ``draining``, routers may still send for up to a second: an in-flight
count of zero only counts once this much time has passed."""


async def wait_drained(
    adapter: EngineAdapter,
    engine: RunningEngine,
    drain_timeout: float,
    skip: asyncio.Event,
    running: Callable[[], bool],
) -> None:
    """Poll ``adapter.in_flight`` until it is zero (after :data:`DRAIN_SETTLE`), ``skip`` is set,
    the engine stops ``running`` or ``drain_timeout`` seconds passed."""
    worker_id = engine.ctx.worker_id
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + drain_timeout
    settle = min(DRAIN_SETTLE, drain_timeout)
    unknown_logged = False
    while not skip.is_set() and loop.time() < deadline and running():
        count = await quietly(adapter.in_flight(engine), default=None)
        if count is None and not unknown_logged:
            log.info(
                "worker %s: engine does not report in-flight requests; waiting --drain-timeout %gs",
                worker_id,
                drain_timeout,
            )
            unknown_logged = True
        if count == 0 and loop.time() - started >= settle:
            log.info("worker %s: no requests in flight after %.1fs", worker_id, loop.time() - started)
            return
        await first_of(skip.wait(), within=min(DRAIN_POLL, max(0.0, deadline - loop.time())))
    if loop.time() >= deadline:
        log.warning(
            "worker %s: --drain-timeout %gs reached with requests maybe still running",
            worker_id,
            drain_timeout,
        )

"""Two small waits the launcher's loops share."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("infera.launcher")


async def quietly(awaitable: Any, default: Any) -> Any:
    """``await awaitable``; ``default`` when it raises (logged at debug level)."""
    try:
        return await awaitable
    except Exception as exc:
        log.debug("engine check failed: %s", exc)
        return default


async def first_of(*aws: Any, within: float) -> None:
    """Wait until one of ``aws`` completes or ``within`` seconds pass (others are left running
    when they are futures, cancelled when they are bare coroutines)."""
    futures = [a if isinstance(a, asyncio.Future) else asyncio.ensure_future(a) for a in aws]
    owned = [f for f, a in zip(futures, aws, strict=True) if f is not a]
    try:
        await asyncio.wait(futures, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in owned:
            f.cancel()

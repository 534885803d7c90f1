"""``infera_core.util.tasks``: cancelling a background task and waiting for its end."""

from __future__ import annotations

import asyncio

from infera_core.util.tasks import cancel_and_wait


async def test_cancel_and_wait_returns_once_the_task_has_run_its_cleanup() -> None:
    started, cleaned = asyncio.Event(), []

    async def loop() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(True)

    task = asyncio.create_task(loop())
    await started.wait()
    await cancel_and_wait(task)
    assert task.cancelled() and cleaned == [True]


async def test_cancel_and_wait_takes_no_task_or_a_finished_one() -> None:
    await cancel_and_wait(None)
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    await cancel_and_wait(done)
    assert done.done() and not done.cancelled()

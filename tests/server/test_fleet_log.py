"""``serve`` logs each worker joining, changing status and leaving: one INFO line each."""

from __future__ import annotations

import logging

import pytest

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for, until
from infera_core.worker import Status, WorkerRecord


async def test_workers_joining_draining_and_leaving_are_logged_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "infera.server.fleet")
    rec = WorkerRecord(
        worker_id="w1", url="http://user:secret@127.0.0.1:9/", model="tiny", engine="vllm", role="prefill"
    )
    async with serving(settings_for(), make_hooks()) as srv:
        srv.store.put(rec)
        await srv.wait_workers(1)
        srv.store.put(rec)  # the same record again (a lease refresh): nothing to say
        srv.store.put(rec.model_copy(update={"status": Status.DRAINING}))
        await until(lambda: srv.core.table.by_id["w1"].record.status is Status.DRAINING)
        srv.store.delete("w1")
        await srv.wait_workers(0)
    lines = [r.getMessage() for r in caplog.records if r.name == "infera.server.fleet"]
    assert lines == [
        "worker w1 joined: model tiny, role prefill, vllm at http://***@127.0.0.1:9/",
        "worker w1 is draining: model tiny, role prefill, vllm at http://***@127.0.0.1:9/",
        "worker w1 left: model tiny, role prefill, vllm at http://***@127.0.0.1:9/",
    ]
    assert all("secret" not in line for line in lines)

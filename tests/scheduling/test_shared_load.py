"""The router-wide in-flight table (infera_core.scheduling.shared_load): counts each process
writes are the sum the cap reads, across a real fork; slots are claimed, left, reused; a
restarted process's leftovers are cleared. ``serve --processes 2`` end to end is in
tests/server/test_processes_inflight.py."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from infera_core.scheduling.arrays import ARRAY_MIN, state
from infera_core.scheduling.scheduler import under_cap
from infera_core.scheduling.shared_load import SharedLoad
from infera_core.scheduling.types import Endpoint
from infera_core.server.fleet import EndpointTable
from infera_core.worker import WorkerRecord


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch) -> Iterator[SharedLoad]:
    shared = SharedLoad(processes=2, capacity=64)
    monkeypatch.setattr(state(), "shared", None)  # put back after the test, whatever it set
    try:
        yield shared
    finally:
        shared.close()


def _sibling(load: SharedLoad, slot: int, n: int) -> None:
    """What process 1 has in flight to ``slot``'s worker, written the way process 1 does."""
    load.q[slot * load.width + 3 + 1] = n


def _table(load: SharedLoad, workers: int) -> EndpointTable:
    table = EndpointTable()
    for i in range(workers):
        table.put(
            WorkerRecord(worker_id=f"w{i}", url=f"http://127.0.0.1:{9000 + i}", model="m", engine="fake")
        )
    load.attach(0)
    table.share_load(load)
    return table


def test_a_count_written_in_a_forked_process_is_read_in_the_parent(load: SharedLoad) -> None:
    slot = load.claim("w0")
    pid = os.fork()
    if pid == 0:  # the sibling: counts 3 in flight as process 1
        code = 1
        try:
            load.attach(1)
            if load.claim("w0") == slot:
                load.q[load.word(slot)] = 3
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    load.q[load.word(slot)] = 2
    assert load.in_flight(slot) == 5


@pytest.mark.parametrize("workers", [3, ARRAY_MIN + 2])  # the per-endpoint path and the arrays'
def test_the_cap_counts_what_sibling_processes_have_in_flight(load: SharedLoad, workers: int) -> None:
    table = _table(load, workers)
    eps = table.candidates("m")
    eps[0].in_flight += 1  # this process: one to w0
    _sibling(load, int(state().load_slot[eps[1].row]), 2)  # the sibling: two to w1
    kept = {ep.worker_id for ep in under_cap(eps, 2)}
    assert "w0" in kept and "w1" not in kept and len(kept) == workers - 1
    eps[0].in_flight += 1
    assert "w0" not in {ep.worker_id for ep in under_cap(eps, 2)}
    eps[0].in_flight -= 2
    _sibling(load, int(state().load_slot[eps[1].row]), 0)
    assert len(under_cap(eps, 2)) == workers


def test_a_worker_that_goes_frees_its_slot_and_stops_counting(load: SharedLoad) -> None:
    table = _table(load, 1)
    (ep,) = table.candidates("m")
    slot = int(state().load_slot[ep.row])
    ep.in_flight += 1
    assert load.in_flight(slot) == 1
    table.remove("w0")
    assert load.in_flight(slot) == 0
    ep.in_flight -= 1  # the request finishing after its worker went writes nothing shared
    assert load.in_flight(slot) == 0 and ep.load_word == -1
    # a slot nobody is present in is taken again: the table's capacity of workers fits
    others = {load.claim(f"x{i}") for i in range(load.capacity)}
    assert -1 not in others and len(others) == load.capacity and slot in others
    assert load.claim("one too many") == -1


def test_a_restarted_process_clears_what_its_predecessor_left(load: SharedLoad) -> None:
    load.attach(1)
    slot = load.claim("w0", in_flight=4)  # process 1 dies with 4 in flight
    load.attach(0)
    assert load.claim("w0") == slot and load.in_flight(slot) == 4
    load.attach(1)  # process 1, restarted
    assert load.in_flight(slot) == 0
    load.attach(0)
    load.leave(slot)  # process 0 leaves too: nobody is present, the slot may be taken
    assert load.table[slot, 2] == 0 and load.in_flight(slot) == 0


def test_an_endpoint_that_had_requests_before_sharing_brings_them(load: SharedLoad) -> None:
    table = EndpointTable()
    ep = table.put(WorkerRecord(worker_id="w0", url="http://127.0.0.1:9000", model="m", engine="fake"))
    assert isinstance(ep, Endpoint)
    ep.in_flight += 2
    load.attach(0)
    table.share_load(load)
    assert load.in_flight(int(state().load_slot[ep.row])) == 2


@pytest.mark.parametrize("workers", [3, ARRAY_MIN + 2])
def test_workers_past_a_full_table_are_capped_on_this_process_count(workers: int) -> None:
    load = SharedLoad(processes=2, capacity=workers - 1)
    arrays = state()
    try:
        table = _table(load, workers)
        eps = table.candidates("m")
        (alone,) = [ep for ep in eps if ep.load_word < 0]
        shared = next(ep for ep in eps if ep.load_word >= 0)
        alone.in_flight += 2
        _sibling(load, int(arrays.load_slot[shared.row]), 2)
        kept = {ep.worker_id for ep in under_cap(eps, 2)}
        assert alone.worker_id not in kept and shared.worker_id not in kept and len(kept) == workers - 2
        alone.in_flight -= 2
        assert alone.worker_id in {ep.worker_id for ep in under_cap(eps, 2)}
        table.remove(alone.worker_id)
        assert load.unslotted == 0
    finally:
        arrays.shared = None
        load.close()

"""API-key budgets in the memory the processes of ``serve --processes N`` share
(:mod:`infera_core.server.budgets`): real forked processes, and key rings bound to one table."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from infera_core.server.budgets import SharedBudgets
from infera_core.server.errors import ApiError
from infera_core.server.keys import KeyRing

DAY = 20000


def _fork(budgets: SharedBudgets, index: int, work: str) -> tuple[int, int]:
    """Fork a process that runs ``work`` as process ``index``; (pid, read end of its pipe)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (runs in the child)
        code = 1
        try:
            os.close(r)
            budgets.attach(index)
            slot = budgets.slot("team")
            assert slot is not None
            if work == "reserve":  # 40 tries of 10 tokens against one budget of 300
                got = sum(budgets.reserve(slot, DAY, 10, 300) < 0 for _ in range(40))
                os.write(w, str(got).encode())
            elif work == "take":
                taken = sum(budgets.take(slot, 30, lambda: 1000.0) < 0 for _ in range(40))
                for _ in range(10):
                    budgets.add_tokens(slot, DAY, 5)
                os.write(w, str(taken).encode())
            else:  # hold the slot's lock until killed
                budgets._lock(budgets._lock_arg(slot))
                os.write(w, b"locked")
                time.sleep(120)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def _read_all(fd: int) -> str:
    out = b""
    while chunk := os.read(fd, 64):
        out += chunk
    os.close(fd)
    return out.decode()


@contextlib.contextmanager
def _team_slot(processes: int) -> Iterator[tuple[SharedBudgets, int]]:
    """A budget table for ``processes`` processes and the slot of key ``team`` in it."""
    budgets = SharedBudgets(processes, capacity=64)
    try:
        slot = budgets.slot("team")
        assert slot is not None
        yield budgets, slot
    finally:
        budgets.close()


def _in_three_processes(budgets: SharedBudgets, work: str) -> list[int]:
    """Run ``work`` in three forked processes at once: the count each one reports (each must exit 0)."""
    children = [_fork(budgets, i, work) for i in range(3)]
    counts = [int(_read_all(r)) for _, r in children]
    for pid, _ in children:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    return counts


def test_processes_take_from_one_bucket_and_sum_their_tokens() -> None:
    with _team_slot(3) as (budgets, slot):
        assert budgets.slot("team") == slot and budgets.slot("other") != slot
        budgets.set_rate(slot, 30, lambda: 1000.0)
        taken = _in_three_processes(budgets, "take")
        assert sum(taken) == 30  # 120 tries by 3 processes against one bucket of 30
        assert budgets.tokens(slot, DAY) == 150
        assert budgets.tokens(slot, DAY + 1) == 0  # a new day starts at 0


def test_processes_reserve_from_one_token_budget_and_never_overdraw_it() -> None:
    with _team_slot(3) as (budgets, slot):
        got = _in_three_processes(budgets, "reserve")
        assert sum(got) == 30  # 120 reservations by 3 processes racing for 300 tokens
        assert budgets.tokens(slot, DAY) == 300
        assert budgets.reserve(slot, DAY, 1, 300) == 300  # full: what is spent comes back
        budgets.settle(slot, DAY, -50)  # this process's request cost 50 less than it reserved
        assert budgets.reserve(slot, DAY, 50, 300) == -1
        budgets.settle(slot, DAY - 1, -1000)  # a reservation of a day gone: no effect on today
        assert budgets.tokens(slot, DAY) == 300


def test_a_process_killed_while_it_holds_a_lock_does_not_wedge_the_others() -> None:
    with _team_slot(2) as (budgets, slot):
        budgets.set_rate(slot, 30, lambda: 1000.0)
        pid, r = _fork(budgets, 1, "hold")
        assert os.read(r, 16) == b"locked"
        os.close(r)
        assert budgets.busy(slot)  # really held, by the other process
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert budgets.take(slot, 30, lambda: 1000.0) < 0  # the dead one's lock passed on
        assert not budgets.busy(slot)


def _ring(path: Path, now: list[float], wall: list[float], budgets: SharedBudgets) -> KeyRing:
    ring = KeyRing(path, clock=lambda: now[0], wall=lambda: wall[0])
    ring.share(budgets)
    return ring


def test_key_rings_on_one_table_enforce_one_budget_across_reloads_and_restarts(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    spec = {"keys": [{"name": "k", "key": "sk", "requests_per_minute": 2, "tokens_per_day": 100}]}
    path.write_text(yaml.safe_dump(spec))
    now, wall = [1000.0], [5 * 86400 + 86000.0]  # 400 s before a UTC midnight
    budgets = SharedBudgets(2, capacity=64)
    try:
        a, b = _ring(path, now, wall, budgets), _ring(path, now, wall, budgets)
        ka, kb = a.lookup(b"sk"), b.lookup(b"sk")
        assert ka is not None and kb is not None and ka.key is not None and kb.key is not None
        a.admit(ka, "m")
        b.admit(kb, "m")
        with pytest.raises(ApiError) as err:
            a.admit(ka, "m")  # the two processes' requests came out of one bucket of 2
        assert err.value.status == 429 and err.value.code == "rate_limit_exceeded"
        assert err.value.headers["Retry-After"] == "30"
        now[0] += 30
        b.admit(kb, "m")

        a.spent(ka, 60)
        b.spent(kb, 40)
        assert a.describe(ka.key)["tokens_today"] == b.describe(kb.key)["tokens_today"] == 100
        now[0] += 60
        with pytest.raises(ApiError) as err:
            b.admit(kb, "m")
        assert err.value.code == "token_budget_exceeded" and err.value.headers["Retry-After"] == "400"

        c = _ring(path, now, wall, budgets)  # a restarted process: what was spent stays spent
        kc = c.lookup(b"sk")
        assert kc is not None
        with pytest.raises(ApiError):
            c.admit(kc, "m")
        wall[0] += 400  # a new UTC day
        c.admit(kc, "m")
        a.admit(ka, "m")
        with pytest.raises(ApiError) as err:
            b.admit(kb, "m")  # the bucket: 2 at +90 s, less the two just taken
        assert err.value.code == "rate_limit_exceeded"

        # a changed limit refills the bucket once, whichever process reads the file first
        spec["keys"][0]["requests_per_minute"] = 3
        path.write_text(yaml.safe_dump(spec))
        now[0] += 1.0  # past the once-a-second look at the file
        a.maybe_reload()
        a.admit(ka, "m")
        b.maybe_reload()  # the same limit: no second refill
        b.admit(kb, "m")
        c.maybe_reload()
        c.admit(kc, "m")
        with pytest.raises(ApiError):
            a.admit(ka, "m")
    finally:
        budgets.close()


def test_a_reservation_in_one_process_is_seen_by_the_others(tmp_path: Path) -> None:
    """Admission reserves ``prompt + max_tokens × n`` in the shared table: while one process's
    request runs, another cannot spend the same tokens; the end settles to the real cost."""
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump({"keys": [{"name": "k", "key": "sk", "tokens_per_day": 100}]}))
    now, wall = [1000.0], [5 * 86400 + 1000.0]
    budgets = SharedBudgets(2, capacity=64)
    try:
        a, b = _ring(path, now, wall, budgets), _ring(path, now, wall, budgets)
        ka, kb = a.lookup(b"sk"), b.lookup(b"sk")
        assert ka is not None and kb is not None and ka.key is not None
        charge = a.admit(ka, "m", tokens=80, prompt=10)
        with pytest.raises(ApiError) as err:
            b.admit(kb, "m", tokens=30)  # 80 reserved by the other process: 30 do not fit
        assert err.value.status == 429 and "has 20 of its 100 tokens left" in err.value.message
        assert err.value.headers["Retry-After"] == str(86400 - 1000)
        with pytest.raises(ApiError) as err:
            b.admit(kb, "m", tokens=101)  # never fits: no Retry-After
        assert "Retry-After" not in err.value.headers
        a.settle(ka, charge, 15)  # the request cost 15
        a.settle(ka, charge, 99)  # settled once
        assert b.describe(ka.key)["tokens_today"] == 15
        b.admit(kb, "m", tokens=85)
    finally:
        budgets.close()

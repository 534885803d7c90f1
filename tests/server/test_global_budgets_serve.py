"""One ``requests_per_minute`` for two real ``infera-run serve`` replicas on one store (a real
etcd; a real ``nats-server -js`` as the NATS plane; ConfigMaps on the stand-in Kubernetes API
server, as ``deploy/kubernetes/base/router.yaml``'s two replicas use them), one of them SIGKILLed mid-run: the
compressed form of ``bench/router/global_budgets.py``'s 3-minute run (the same bound: one
bucket plus its refill over the run, + 5 %; budgets kept per replica admit about twice it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.router.global_budgets import drive, replicas, start_store

RPM = 60
RATE = 20.0  # requests per second over both: 20× the key's rate, so two budgets would show
SECONDS = 8.0


# the NATS and Kubernetes stores' lease paths run on the default run too (test_global_budgets.py)
@pytest.mark.parametrize(
    "store",
    [
        "etcd",
        pytest.param("nats", marks=pytest.mark.slow),
        pytest.param("kubernetes", marks=pytest.mark.slow),
    ],
)
def test_two_replicas_admit_one_budget_and_a_killed_one_changes_nothing(store: str, tmp_path: Path) -> None:
    try:
        server, flags = start_store(store)
    except RuntimeError as exc:  # the binary is missing
        pytest.skip(str(exc))
    try:
        with replicas(flags, RPM, tmp_path) as reps:
            run = drive(reps, RATE, SECONDS, kill_at=SECONDS / 2)
    finally:
        server.close()
    row = run.row(RPM)
    assert run.failed == 0, row
    assert run.killed_at is not None, row
    assert sum(run.admitted) <= run.bound(RPM), row  # one budget, not two
    assert sum(run.admitted) >= RPM * 0.5, row  # and most of it
    assert all(n > 0 for n in run.admitted), row  # both replicas admitted a part
    assert sum(run.refused) >= RATE * SECONDS - run.bound(RPM) - 1, row

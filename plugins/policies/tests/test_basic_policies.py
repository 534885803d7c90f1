"""The basic policies of infera-policies: random, least-load, power-of-two, session affinity."""

from __future__ import annotations

from collections import Counter

import pytest

from infera_core.plugin.hooks import InferaHooks
from infera_core.request import RequestContext
from infera_core.scheduling.router_config import RouterConfig
from infera_core.scheduling.scheduler import Scheduler, build_scheduler
from infera_core.scheduling.types import SchedulerDeps
from infera_core.server.fleet import EndpointTable
from infera_core.testing.fixtures import make_hooks
from infera_core.worker import WorkerRecord


@pytest.fixture(scope="module")
def hooks() -> InferaHooks:
    return make_hooks()


def _table(n: int) -> EndpointTable:
    table = EndpointTable()
    for i in range(n):
        table.put(WorkerRecord(worker_id=f"w{i}", url=f"http://w{i}", model="m", engine="sim"))
    return table


def _sched(hooks: InferaHooks, table: EndpointTable, **config: object) -> Scheduler:
    return build_scheduler(
        table, RouterConfig.model_validate(config), hooks.catalog().policies, SchedulerDeps()
    )


def _ctx(session: str | None = None, user: str | None = None) -> RequestContext:
    body: dict[str, object] = {"model": "m"}
    if user:
        body["user"] = user
    return RequestContext(
        "r", "m", "/v1/chat/completions", body, {"x-session-id": session} if session else {}
    )


def test_presets_are_registered_by_the_plugin(hooks: InferaHooks) -> None:
    policies = hooks.catalog().policies
    for name in ("random", "least-load", "power-of-two", "session-affinity"):
        assert policies.preset_entries() and policies.preset(name)
    assert {e.name: e.owner for e in policies.preset_entries()}["least-load"] == "policies"


def test_random_spreads_and_is_reproducible_with_a_seed(hooks: InferaHooks) -> None:
    table = _table(4)
    s = _sched(hooks, table, filters=[{"name": "health"}], picker={"name": "random", "params": {"seed": 7}})
    picks = [s.schedule(_ctx()).worker_id for _ in range(400)]
    counts = Counter(picks)
    assert set(counts) == {"w0", "w1", "w2", "w3"}
    assert min(counts.values()) > 50
    again = _sched(
        hooks, _table(4), filters=[{"name": "health"}], picker={"name": "random", "params": {"seed": 7}}
    )
    assert [again.schedule(_ctx()).worker_id for _ in range(400)] == picks


def test_least_load_prefers_fewest_in_flight(hooks: InferaHooks) -> None:
    table = _table(3)
    s = _sched(hooks, table, preset="least-load")
    loads = {"w0": 4, "w1": 1, "w2": 2}
    for wid, n in loads.items():
        table.by_id[wid].in_flight = n
    for _ in range(3):
        ep = s.schedule(_ctx())
        assert ep.in_flight == min(e.in_flight for e in table.by_id.values())
        ep.in_flight += 1  # as the server does while the request runs
    assert table.by_id["w0"].in_flight == 4  # the busiest never got one


def test_power_of_two_never_picks_the_busiest(hooks: InferaHooks) -> None:
    table = _table(3)
    s = _sched(hooks, table, preset="power-of-two")
    table.by_id["w0"].in_flight = 100
    picks = Counter(s.schedule(_ctx()).worker_id for _ in range(300))
    assert picks["w0"] == 0 and picks["w1"] > 50 and picks["w2"] > 50


def test_session_affinity_is_sticky_and_spreads_sessions(hooks: InferaHooks) -> None:
    table = _table(4)
    s = _sched(hooks, table, preset="session-affinity")
    owners = {f"s{i}": s.schedule(_ctx(session=f"s{i}")).worker_id for i in range(40)}
    for sid, wid in owners.items():
        assert s.schedule(_ctx(session=sid)).worker_id == wid
    assert len(set(owners.values())) == 4
    assert s.schedule(_ctx(user="alice")).worker_id == s.schedule(_ctx(user="alice")).worker_id


def test_session_affinity_moves_only_the_removed_workers_sessions(hooks: InferaHooks) -> None:
    table = _table(4)
    s = _sched(hooks, table, preset="session-affinity")
    before = {f"s{i}": s.schedule(_ctx(session=f"s{i}")).worker_id for i in range(60)}
    table.remove("w2")
    after = {sid: s.schedule(_ctx(session=sid)).worker_id for sid in before}
    moved = {sid for sid in before if before[sid] != after[sid]}
    assert moved == {sid for sid, w in before.items() if w == "w2"}


def test_session_affinity_bounded_load_overflows_to_the_next_worker(hooks: InferaHooks) -> None:
    table = _table(2)
    s = _sched(hooks, table, preset="session-affinity")
    home = s.schedule(_ctx(session="hot"))
    home.in_flight = 10  # far above load_factor × average
    other = s.schedule(_ctx(session="hot"))
    assert other.worker_id != home.worker_id
    home.in_flight = 0
    assert s.schedule(_ctx(session="hot")).worker_id == home.worker_id


def test_no_session_key_falls_back_to_least_loaded(hooks: InferaHooks) -> None:
    table = _table(3)
    s = _sched(hooks, table, preset="session-affinity")
    table.by_id["w0"].in_flight = 2
    table.by_id["w1"].in_flight = 2
    assert {s.schedule(_ctx()).worker_id for _ in range(3)} == {"w2"}

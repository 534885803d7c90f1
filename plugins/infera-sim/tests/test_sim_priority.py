"""``--scheduling-policy priority``: the sim's waiting queue by the body's ``priority`` (lower
first, then arrival), as vLLM's; a non-zero ``priority`` refused under ``fcfs``; the adapter
records the order for the router."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from infera_sim.adapter import SimAdapter
from infera_sim.config import SimConfig
from infera_sim.engine import SimEngine
from infera_sim.request import SimRequest
from infera_sim.testing import run_requests, start_sim
from infera_sim.tokenizer import SimTokenizer

from infera_core.engines.base import LaunchContext
from infera_core.worker import PriorityOrder, Role


def _finish_order(policy: str) -> list[str]:
    cfg = SimConfig(max_num_seqs=1, scheduling_policy=policy, speedup=float("inf"))
    engine = SimEngine(cfg, SimTokenizer())
    reqs = [SimRequest(f"bulk{i}", list(range(10, 40)), 4, ignore_eos=True, priority=1) for i in range(4)]
    reqs.append(SimRequest("vip", list(range(50, 80)), 4, ignore_eos=True, priority=-1))
    order: list[str] = []

    async def run() -> None:
        async def watch(r: SimRequest) -> None:
            while not r.done:
                await r.wake.wait()
                r.wake.clear()
            order.append(r.request_id)

        watchers = [asyncio.ensure_future(watch(r)) for r in reqs]
        await run_requests(engine, reqs)
        await asyncio.gather(*watchers)

    asyncio.run(run())
    return order


def test_priority_policy_serves_a_lower_value_first_and_fcfs_in_arrival_order() -> None:
    # one running at a time, all five waiting at first: vip (priority -1) jumps the queue
    assert _finish_order("priority") == ["vip", "bulk0", "bulk1", "bulk2", "bulk3"]
    assert _finish_order("fcfs") == ["bulk0", "bulk1", "bulk2", "bulk3", "vip"]


def test_a_nonzero_priority_is_refused_unless_the_sim_schedules_by_priority() -> None:
    body = {"prompt": "hello", "max_tokens": 2, "priority": 3}
    with start_sim(kv_events_port=None, kv_replay_port=None) as fcfs, httpx.Client(timeout=30) as c:
        r = c.post(fcfs.url + "/v1/completions", json=body)
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "Got priority 3 but Priority scheduling is not enabled."
        assert c.post(fcfs.url + "/v1/completions", json={**body, "priority": 0}).status_code == 200
        bad = c.post(fcfs.url + "/v1/completions", json={**body, "priority": "high"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"
    with start_sim(kv_events_port=None, kv_replay_port=None, scheduling_policy="priority") as prio:
        assert httpx.post(prio.url + "/v1/completions", json=body, timeout=30).status_code == 200


@pytest.mark.parametrize(
    ("policy", "order"), [(None, None), ("fcfs", None), ("priority", PriorityOrder.LOWER_FIRST)]
)
def test_the_adapter_records_whether_the_sim_schedules_by_priority(
    policy: str | None, order: PriorityOrder | None
) -> None:
    opts = {"scheduling_policy": policy} if policy else {}
    ctx = LaunchContext("w", "m", None, Role.MIXED, "127.0.0.1", 8000, "127.0.0.1", options=opts)
    adapter = SimAdapter()
    assert adapter.record_fields(ctx).priority == order
    argv = adapter.build_launch(ctx).argv
    assert ("--scheduling-policy" in argv) == (policy is not None)
    # the engine's own spelling after -- is read the same way
    ctx = LaunchContext(
        "w",
        "m",
        None,
        Role.MIXED,
        "127.0.0.1",
        8000,
        "127.0.0.1",
        engine_args=["--scheduling-policy", "priority"],
    )
    assert adapter.record_fields(ctx).priority is PriorityOrder.LOWER_FIRST


class _Recording(SimEngine):
    """A sim engine that notes whom it preempts."""

    preempted: list[str]

    def _preempt(self, r: SimRequest) -> None:
        self.preempted.append(r.request_id)
        super()._preempt(r)


@pytest.mark.parametrize(("policy", "victim"), [("fcfs", "vip"), ("priority", "bulk1")])
def test_out_of_blocks_the_priority_policy_preempts_the_lowest_priority_request(
    policy: str, victim: str
) -> None:
    """As vLLM's scheduler: with no block for a running request's next token, ``priority``
    preempts the running request of the largest ``(priority, arrival)``; ``fcfs`` the last
    admitted (here the critical one, admitted after the two bulk ones)."""
    cfg = SimConfig(block_size=16, cache_blocks=6, scheduling_policy=policy, speedup=float("inf"))
    engine = _Recording(cfg, SimTokenizer())
    engine.preempted = []
    reqs = [
        SimRequest(f"bulk{i}", list(range(10 + i, 26 + i)), 40, ignore_eos=True, priority=1) for i in range(2)
    ]
    vip = SimRequest("vip", list(range(50, 66)), 40, ignore_eos=True, priority=-1)
    for r in reqs:
        engine.add(r)
    for step in range(400):  # stepped by hand, as bench/fleet/fairness.py does
        if step == 2:
            engine.add(vip)
        plan, duration = engine._plan()
        if not plan:
            break
        engine.sim_time += duration
        engine._execute(plan, engine.sim_time)
    assert engine.preempted[0] == victim
    assert all(r.done and r.num_generated == 40 for r in [*reqs, vip])

"""Priority reaches the engine, live: an in-process router in front of two real sims over HTTP.

The sim ``prio`` runs ``--scheduling-policy priority`` (its record says ``priority:
lower_first``); the sim ``fcfs`` does not (a non-zero ``priority`` would be refused with 400,
as older vLLM releases did). Both run one request at a time (``--max-num-seqs 1``), so a flood
waits in the engine's own queue. A critical key's request sent after a sheddable flood
finishes ahead of it on ``prio`` (the router sent ``priority: -1`` and the flood ``1``) and last
on ``fcfs`` (which never got the field: every answer is 200)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from infera_sim.metrics import parse_gauges
from infera_sim.testing import SimHandle, start_sim

from infera_core.testing.server import serving_fleet, settings_for
from infera_core.worker import PriorityOrder, WorkerRecord

KEYS = {
    "keys": [
        {"name": "bulk", "key": "sk-bulk", "priority": "sheddable"},
        {"name": "vip", "key": "sk-vip", "priority": "critical"},
        {"name": "std", "key": "sk-std"},
    ]
}
FLOOD = 5


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, SimHandle]]:
    common = {"kv_events_port": None, "kv_replay_port": None, "max_num_seqs": 1, "itl_base_ms": 20.0}
    with (
        start_sim(model="prio", scheduling_policy="priority", **common) as prio,
        start_sim(model="fcfs", **common) as fcfs,
    ):
        yield {"prio": prio, "fcfs": fcfs}


def _records(sims: dict[str, SimHandle]) -> list[WorkerRecord]:
    return [
        WorkerRecord(
            worker_id="p",
            url=sims["prio"].url,
            model="prio",
            engine="sim",
            priority=PriorityOrder.LOWER_FIRST,
        ),
        WorkerRecord(worker_id="f", url=sims["fcfs"].url, model="fcfs", engine="sim"),
    ]


async def _waiting(c: httpx.AsyncClient, sim: SimHandle) -> int:
    text = (await c.get(sim.url + "/metrics")).text
    return int(sum(parse_gauges(text, ("vllm:num_requests_waiting",)).values()))


async def _flood_then_vip(c: httpx.AsyncClient, sim: SimHandle, model: str) -> tuple[list[str], list[int]]:
    """``FLOOD`` sheddable requests, then (once they wait in the engine) one critical: the
    order they finish in, and every status."""
    done: list[str] = []
    statuses: list[int] = []

    async def post(key: str, **extra: object) -> None:
        body = {"model": model, "prompt": "hello there", "max_tokens": 6, "ignore_eos": True, **extra}
        r = await c.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        statuses.append(r.status_code)
        done.append(key if r.status_code == 200 else f"{key}:{r.status_code}:{r.text}")

    flood = [asyncio.ensure_future(post("sk-bulk")) for _ in range(FLOOD)]
    async with asyncio.timeout(30):
        while await _waiting(c, sim) < FLOOD - 1:  # noqa: ASYNC110 (another process's queue)
            await asyncio.sleep(0.01)
    await asyncio.gather(post("sk-vip"), post("sk-std", priority=7), *flood)
    return done, statuses


async def test_a_critical_request_overtakes_a_sheddable_flood_only_where_the_engine_schedules_by_priority(
    sims: dict[str, SimHandle], tmp_path: Path
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump(KEYS))
    settings = settings_for(api_key_file=keys, queue_max=0, first_byte_timeout=30.0)
    async with serving_fleet(*_records(sims), settings=settings) as (_, c):
        c.timeout = httpx.Timeout(60)
        order, statuses = await _flood_then_vip(c, sims["prio"], "prio")
        assert statuses == [200] * (FLOOD + 2), order
        # one bulk request was running when vip arrived; vip (-1) and std (the client's 7 replaced
        # by the key's tier, 0) go before the waiting bulk ones (1)
        assert order.index("sk-vip") <= 1 and order.index("sk-std") <= 2, order
        order, statuses = await _flood_then_vip(c, sims["fcfs"], "fcfs")
        # no priority field reached the fcfs sim (it refuses a non-zero one): all 200, vip last
        assert statuses == [200] * (FLOOD + 2), order
        assert order.index("sk-vip") >= FLOOD - 1, order

"""The request's tier as the engine's ``priority`` (server/priority.py, fairqueue.engine_priority)."""

from __future__ import annotations

import json

import pytest

from infera_core.scheduling.fairqueue import TIERS, engine_priority
from infera_core.server.priority import with_priority
from infera_core.worker import PriorityOrder, WorkerRecord

LOW, HIGH = PriorityOrder.LOWER_FIRST, PriorityOrder.HIGHER_FIRST


def _send(body: dict[str, object], tier: int, order: PriorityOrder | None) -> dict[str, object]:
    raw = json.dumps(body).encode()
    out: dict[str, object] = json.loads(with_priority(raw, body, tier, order))
    return out


def test_tiers_map_to_each_engines_order_in_one_place() -> None:
    assert [engine_priority(TIERS[t], LOW) for t in ("critical", "standard", "sheddable")] == [-1, 0, 1]
    assert [engine_priority(TIERS[t], HIGH) for t in ("critical", "standard", "sheddable")] == [1, 0, -1]
    assert engine_priority(7, LOW) == -7


@pytest.mark.parametrize(
    ("body", "tier", "order", "sent"),
    [
        ({"model": "m"}, 1, LOW, -1),  # critical to vLLM: earlier
        ({"model": "m"}, -1, LOW, 1),
        ({"model": "m"}, -1, HIGH, -1),  # SGLang's default order
        ({"model": "m"}, 0, LOW, None),  # standard: the engines' default, nothing added
        ({"model": "m", "priority": -100}, 0, LOW, 0),  # the key decides, not the body
        ({"model": "m", "priority": 5}, 1, None, None),  # never to an engine without priority
        ({"model": "m"}, 1, None, None),
    ],
)
def test_the_body_carries_the_tier_only_to_a_priority_worker(
    body: dict[str, object], tier: int, order: PriorityOrder | None, sent: int | None
) -> None:
    out = _send(body, tier, order)
    assert out.get("priority") == sent
    assert out["model"] == "m"


def test_an_unchanged_body_is_forwarded_as_the_same_bytes() -> None:
    raw = b'{ "model":"m","x":1}'
    assert with_priority(raw, {"model": "m", "x": 1}, 0, LOW) is raw
    assert with_priority(raw, {"model": "m", "x": 1}, 1, None) is raw
    assert with_priority(raw, {"model": "m", "x": 1}, 1, LOW) == b'{"priority":-1, "model":"m","x":1}'


def test_a_record_says_how_its_engine_schedules_and_old_readers_default_to_none() -> None:
    rec = WorkerRecord(worker_id="w", url="http://h:1", model="m", engine="vllm", priority=LOW)
    assert WorkerRecord.from_json(rec.to_json()).priority is LOW
    legacy = {"worker_id": "w", "url": "http://h:1", "model": "m", "engine": "vllm"}
    assert WorkerRecord.from_json(json.dumps(legacy)).priority is None

"""The sim's KV events: vLLM 0.32's wire layout, eviction, mirroring, replay, faults."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import zmq
from infera_sim.kv_publisher import encode_batch
from infera_sim.testing import KvMirror, SimHandle, start_sim

from infera_core.kv.decode import MsgpackEventDecoder
from infera_core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

RECORDED = Path(__file__).parents[3] / "tests" / "kv" / "data"


def _recorded_events(name: str) -> list[dict[str, Any]]:
    out = []
    for line in (RECORDED / f"kv-events-{name}.jsonl").read_text().splitlines():
        payload = bytes.fromhex(json.loads(line)["payload_hex"])
        out.extend(msgspec.msgpack.decode(payload)[1])
    return out


def _complete(sim: SimHandle, prompt: str | list[int], max_tokens: int = 2) -> dict[str, Any]:
    resp = httpx.post(
        sim.url + "/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens}, timeout=10
    )
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def _cache(sim: SimHandle) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(sim.url + "/sim/cache").json()
    return data


@pytest.fixture
def small_sim() -> Iterator[SimHandle]:
    with start_sim(speedup="inf", cache_blocks=12, block_size=16) as sim:
        yield sim


def test_frames_have_vllm_032_layout(small_sim: SimHandle) -> None:
    assert small_sim.kv_events_endpoint is not None
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(small_sim.kv_events_endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    time.sleep(0.3)  # slow joiner
    try:
        _complete(small_sim, list(range(10, 60)))
        assert sub.poll(5000)
        topic, seq, payload = sub.recv_multipart()
    finally:
        sub.close(0)
        ctx.term()
    assert topic == b"kv-events" and seq == (0).to_bytes(8, "big")
    ts, events, dp_rank = msgspec.msgpack.decode(payload)
    assert isinstance(ts, float) and dp_rank == 0
    recorded = {e["type"]: list(e) for e in _recorded_events("evict-and-clear")}
    assert list(events[0]) == recorded["BlockStored"]  # same field names, same order
    stored = MsgpackEventDecoder("vllm").decode(payload).events[0]
    assert isinstance(stored, BlockStored)
    assert stored.token_ids == list(range(10, 58)) and len(stored.block_hashes) == 3
    assert stored.parent_block_hash is None and stored.block_size == 16


def test_array_layout_decodes_with_the_same_decoder() -> None:
    events: list[KvEvent] = [
        BlockStored([7, 8], 3, list(range(32)), 16, None, "GPU"),
        BlockRemoved([7], "GPU"),
        AllBlocksCleared(),
    ]
    decoder = MsgpackEventDecoder("vllm")
    for layout in ("map", "array"):
        batch = decoder.decode(encode_batch(1.5, events, 0, layout))
        assert [type(e) for e in batch.events] == [BlockStored, BlockRemoved, AllBlocksCleared]
        first = batch.events[0]
        assert (
            isinstance(first, BlockStored) and first.block_hashes == [7, 8] and first.parent_block_hash == 3
        )
    recorded = {e["type"]: list(e) for e in _recorded_events("evict-and-clear")}
    raw_map = msgspec.msgpack.decode(encode_batch(1.5, events, 0, "map"))[1]
    assert [list(e) for e in raw_map] == [
        recorded[k] for k in ("BlockStored", "BlockRemoved", "AllBlocksCleared")
    ]
    raw = msgspec.msgpack.decode(encode_batch(1.5, events, 0, "array"))[1]
    assert raw[0][0] == "BlockStored" and raw[1] == ["BlockRemoved", [7], "GPU"]


def test_eviction_is_announced_and_a_subscriber_mirrors_the_cache(small_sim: SimHandle) -> None:
    assert small_sim.kv_events_endpoint is not None
    mirror = KvMirror(small_sim.kv_events_endpoint, small_sim.replay_endpoint)
    try:
        for i in range(8):  # 8 distinct prompts × 3 full blocks > 12 blocks of cache
            _complete(small_sim, [100 + i] * 50)
        _complete(small_sim, [100] * 50)  # the first one again: evicted, recomputed
        state = _cache(small_sim)
        mirror.sync(state["next_seq"])
        assert any(isinstance(e, BlockRemoved) for e in mirror.events)
        assert mirror.blocks == set(state["block_hashes"])
        assert len(mirror.blocks) <= 12
        assert httpx.post(small_sim.url + "/reset_prefix_cache").status_code == 200
        mirror.sync(_cache(small_sim)["next_seq"])
        assert isinstance(mirror.events[-1], AllBlocksCleared) and mirror.blocks == set()
    finally:
        mirror.close()


@pytest.mark.parametrize(
    "faults",
    [{"fault_kv_drop_rate": 0.5}, {"fault_kv_reorder": True, "fault_kv_duplicate_rate": 0.3}],
    ids=["drop", "reorder-duplicate"],
)
def test_replay_recovers_missed_batches(faults: dict[str, Any]) -> None:
    with start_sim(speedup="inf", cache_blocks=10, seed=7, **faults) as sim:
        assert sim.kv_events_endpoint is not None
        mirror = KvMirror(sim.kv_events_endpoint, sim.replay_endpoint)
        try:
            time.sleep(0.3)
            for i in range(12):
                _complete(sim, [200 + i] * 40)
                mirror.poll(0.01)
            state = _cache(sim)
            mirror.sync(state["next_seq"])
            assert mirror.next_seq == state["next_seq"]
            assert mirror.replayed > 0
            assert mirror.blocks == set(state["block_hashes"])
        finally:
            mirror.close()


def test_array_layout_flag() -> None:
    with start_sim(speedup="inf", kv_events_layout="array") as sim:
        assert sim.kv_events_endpoint is not None
        mirror = KvMirror(sim.kv_events_endpoint, sim.replay_endpoint)
        try:
            _complete(sim, list(range(5, 40)))
            mirror.sync(_cache(sim)["next_seq"])
            assert mirror.blocks == set(_cache(sim)["block_hashes"]) and len(mirror.blocks) == 2
            assert mirror.decoder.slow_batches > 0  # arrays take the decoder's tolerant path
        finally:
            mirror.close()

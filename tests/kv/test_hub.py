"""The event hub against real sim engine processes over ZMQ (gaps, replay, stale views)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import httpx
import msgspec
import pytest
import zmq
from prometheus_client import CollectorRegistry

from infera_core.kv import accel
from infera_core.kv.events import BlockStored, KvEventBatch
from infera_core.kv.hub import KvHub
from infera_core.kv.settings import KvSettings
from infera_core.plugin.hooks import InferaHooks
from infera_core.testing.server import eventually
from infera_core.util.net import free_port
from infera_core.worker import KvEventsInfo, WorkerRecord

sim_testing = pytest.importorskip("infera_sim.testing")
sim_tokenizer = pytest.importorskip("infera_sim.tokenizer")

Send = Callable[[list[bytes]], None]

BS = 16


def _record(sim: object, worker_id: str = "sim-0") -> WorkerRecord:
    return WorkerRecord(
        worker_id=worker_id,
        url=sim.url,  # type: ignore[attr-defined]
        model="sim-model",
        engine="sim",
        kv_events=KvEventsInfo(
            endpoint=sim.kv_events_endpoint,  # type: ignore[attr-defined]
            replay_endpoint=sim.replay_endpoint,  # type: ignore[attr-defined]
            format="vllm",
            block_size=BS,
        ),
    )


def _prompt(i: int) -> str:
    return f"question {i}: " + " ".join(f"word{i}x{j}" for j in range(60))


def _matched(hub: KvHub, worker_id: str, text: str) -> int:
    tokens = sim_tokenizer.SimTokenizer(32000).encode(text)
    view = hub.index.view(worker_id, None)
    if view is None:
        return -1
    hashes = hub.index.hash_prompt(tokens, BS)
    return int(hub.index.match(hashes, [view])[0]) - len(hashes)  # 0 = fully cached


async def _complete(client: httpx.AsyncClient, url: str, text: str) -> None:
    r = await client.post(
        url + "/v1/completions", json={"model": "sim-model", "prompt": text, "max_tokens": 1}
    )
    assert r.status_code == 200, r.text


def _bare(
    worker_id: str,
    port: int = 9,
    fmt: str = "vllm",
    engine: str = "vllm",
    block_size: int = BS,
    dp_size: int = 1,
) -> WorkerRecord:
    """A worker whose engine is not there (port 9): only its KV events (``fmt`` on ``port``) matter."""
    kv = KvEventsInfo(endpoint=f"tcp://127.0.0.1:{port}", format=fmt, block_size=block_size)
    url = "http://127.0.0.1:9"
    return WorkerRecord(worker_id=worker_id, url=url, model="m", engine=engine, dp_size=dp_size, kv_events=kv)


def _hub(settings: KvSettings | None = None) -> tuple[KvHub, CollectorRegistry]:
    registry = CollectorRegistry()
    return KvHub(InferaHooks.load().catalog(), registry, settings), registry


@contextlib.asynccontextmanager
async def _following(
    *records: WorkerRecord, settings: KvSettings | None = None
) -> AsyncIterator[tuple[KvHub, CollectorRegistry]]:
    """A started hub following ``records`` (added once it runs), closed at the end."""
    hub, registry = _hub(settings)
    await hub.start()
    try:
        for record in records:
            hub.worker_added(record)
        yield hub, registry
    finally:
        await hub.close()


@pytest.mark.parametrize(("layout", "store"), [("map", "native"), ("array", "native"), ("map", "python")])
async def test_hub_mirrors_a_sim_and_drops_it_when_it_leaves(
    layout: str, store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if store == "python":  # INFERA_KV_NATIVE=0: dict tables, every batch through the decoder
        monkeypatch.setattr(accel, "ops", accel.PYTHON)
    with sim_testing.start_sim(speedup="inf", block_size=BS, kv_events_layout=layout) as sim:
        hub, registry = _hub()
        hub.worker_added(_record(sim))
        await hub.start()
        try:
            async with httpx.AsyncClient() as client:
                # the SUB may join after the first batch (slow joiner): replay fills it in
                for i in range(3):
                    await _complete(client, sim.url, _prompt(i))
            assert await eventually(lambda: all(_matched(hub, "sim-0", _prompt(i)) == 0 for i in range(3)))
            assert _matched(hub, "sim-0", _prompt(99)) < 0  # never sent: not cached
            view = hub.cache_view("sim-0")
            assert view["blocks"] > 0 and view["stale"] is False and view["last_event_at"] is not None
            pub = view["publishers"][0]
            # both layouts go straight to the native parser; the Python store decodes them all
            assert pub["native_batches"] == (pub["batches"] if store == "native" else 0)
            applied = registry.get_sample_value("infera_kv_events_applied_total", {"worker": "sim-0"})
            assert applied is not None and applied > 0
            memory = registry.get_sample_value("infera_kv_index_memory_bytes")
            assert memory is not None and memory > 0
            hub.worker_removed("sim-0")
            assert hub.index.views_of("sim-0") == [] and hub.cache_view("sim-0")["blocks"] == 0
        finally:
            await hub.close()


async def test_dropped_event_batches_are_recovered_through_replay() -> None:
    with sim_testing.start_sim(speedup="inf", block_size=BS, fault_kv_drop_rate=0.3) as sim:
        async with _following(_record(sim)) as (hub, registry):
            async with httpx.AsyncClient() as client:
                for i in range(20):
                    await _complete(client, sim.url, _prompt(i))
                # a gap is only visible when a later batch arrives: keep the sim talking
                for j in range(30):
                    if all(_matched(hub, "sim-0", _prompt(i)) == 0 for i in range(20)):
                        break
                    await _complete(client, sim.url, _prompt(1000 + j))
                    await asyncio.sleep(0.05)
            assert await eventually(lambda: all(_matched(hub, "sim-0", _prompt(i)) == 0 for i in range(20)))
            pubs = hub.cache_view("sim-0")["publishers"][0]
            assert pubs["gaps"] > 0 and pubs["replays"] > 0 and pubs["replays_failed"] == 0
            assert registry.get_sample_value("infera_kv_gaps_total", {"worker": "sim-0"}) == pubs["gaps"]
            assert hub.cache_view("sim-0")["stale"] is False


async def test_gap_older_than_the_replay_buffer_clears_the_view_and_marks_it_stale() -> None:
    settings = KvSettings(kv_refill_s=60)
    with sim_testing.start_sim(
        speedup="inf", block_size=BS, fault_kv_drop_rate=0.5, kv_replay_buffer=1
    ) as sim:
        async with _following(_record(sim), settings=settings) as (hub, registry):
            async with httpx.AsyncClient() as client:
                for i in range(40):
                    await _complete(client, sim.url, _prompt(i))
                    if hub.cache_view("sim-0")["stale"]:
                        break
            assert await eventually(lambda: hub.cache_view("sim-0")["stale"] is True)
            assert hub.cache_view("sim-0")["publishers"][0]["replays_failed"] > 0
            assert registry.get_sample_value("infera_kv_stale_workers") == 1


async def test_silent_worker_is_reported() -> None:
    async with _following(_bare("mute", block_size=32), settings=KvSettings(kv_silence_s=0.05)) as (
        hub,
        registry,
    ):
        await asyncio.sleep(0.2)
        assert hub.silent_workers() == []  # idle: publishing nothing is fine
        hub.index.routed_at["mute"] = time.time()  # a request went there
        assert await eventually(lambda: hub.silent_workers() == ["mute"], within=2)
        assert registry.get_sample_value("infera_kv_silent_workers") == 1
        assert hub.cache_view("mute")["silent"] is True


async def test_unknown_decoder_format_is_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    async with _following(_bare("odd", fmt="nope", engine="x")) as (hub, _):
        assert "unknown KV event decoder 'nope'" in caplog.text
        assert hub.cache_view("odd")["publishers"] == []


def _port_pair() -> int:
    """A free port P with P + 1 free too (SGLang DP attention publishes rank r on P + r)."""
    import socket

    for _ in range(50):
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise RuntimeError("no two consecutive free ports")


async def test_one_view_per_dp_rank_with_a_publisher_per_rank() -> None:
    pub, rep = _port_pair(), _port_pair()
    common = {"speedup": "inf", "block_size": BS}
    with (
        sim_testing.start_sim(kv_events_port=pub, kv_replay_port=rep, dp_rank=0, **common) as rank0,
        sim_testing.start_sim(kv_events_port=pub + 1, kv_replay_port=rep + 1, dp_rank=1, **common) as rank1,
    ):
        record = WorkerRecord(
            worker_id="dp",
            url=rank0.url,
            model="sim-model",
            engine="sglang",
            dp_size=2,
            kv_events=KvEventsInfo(
                endpoint=f"tcp://127.0.0.1:{pub}",
                replay_endpoint=f"tcp://127.0.0.1:{rep}",
                format="sglang",
                block_size=BS,
                port_per_dp_rank=True,
            ),
        )
        async with _following(record) as (hub, _):
            async with httpx.AsyncClient() as client:
                await _complete(client, rank1.url, _prompt(7))
            assert await eventually(
                lambda: (v := hub.index.view("dp", 1)) is not None and v.block_count() > 0
            )
            view0 = hub.index.view("dp", 0)
            assert view0 is None or view0.block_count() == 0
            assert [p["rank"] for p in hub.cache_view("dp")["publishers"]] == [0, 1]


@contextlib.asynccontextmanager
async def _raw_publisher(
    worker_id: str, dp_size: int = 1
) -> AsyncIterator[tuple[KvHub, CollectorRegistry, Send]]:
    """A hub following a bare ZMQ PUB socket; ``send(frames)`` publishes them as seq 0, 1, …"""
    port = free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://127.0.0.1:{port}")
    record = _bare(worker_id, port=port, dp_size=dp_size)

    def send(frames: list[bytes]) -> None:
        for seq, payload in enumerate(frames):
            pub.send_multipart([b"kv-events", seq.to_bytes(8, "big"), payload])

    try:
        async with _following(record) as (hub, registry):
            yield hub, registry, send
    finally:
        pub.close(0)
        ctx.term()


async def test_ranks_sharing_one_publisher_get_a_view_each() -> None:
    """DP ranks on one socket: each batch's own dp_rank picks the view (read natively)."""
    frames = [
        msgspec.msgpack.encode(KvEventBatch(0.0, [BlockStored([1], None, list(range(BS)), BS)], 0)),
        msgspec.msgpack.encode(KvEventBatch(0.0, [BlockStored([2, 3], None, list(range(2 * BS)), BS)], 1)),
    ]

    def counts() -> list[int]:
        return [v.block_count() if (v := hub.index.view("dp", r)) else 0 for r in (0, 1)]

    async with _raw_publisher("dp", dp_size=2) as (hub, _, send):
        for _ in range(100):  # the SUB joins asynchronously: resend until both landed
            send(frames)
            if all(counts()):
                break
            await asyncio.sleep(0.05)
        assert counts() == [1, 2]
        p = hub.cache_view("dp")["publishers"][0]
        assert p["native_batches"] == p["batches"] > 0


async def test_bad_and_empty_batches_are_counted_and_the_stream_goes_on() -> None:
    good = msgspec.msgpack.encode(KvEventBatch(0.0, [BlockStored([1, 2], None, list(range(2 * BS)), BS)], 0))
    frames = [b"\xc1not msgpack", msgspec.msgpack.encode([0.0, [], 0]), good]
    async with _raw_publisher("raw") as (hub, registry, send):
        # the SUB joins asynchronously: resend the sequence until the good batch lands
        for _ in range(100):
            send(frames)
            view = hub.cache_view("raw")
            p = view["publishers"][0]
            if view["blocks"] == 2 and p["undecodable_batches"] and p["empty_batches"]:
                break
            await asyncio.sleep(0.05)
        pubs = hub.cache_view("raw")["publishers"][0]
        assert hub.cache_view("raw")["blocks"] == 2
        assert pubs["undecodable_batches"] >= 1 and pubs["empty_batches"] >= 1
        bad = registry.get_sample_value("infera_kv_batches_undecodable_total", {"worker": "raw"})
        assert bad is not None and bad >= 1


async def test_a_quiet_worker_is_known_from_its_replay_buffer_when_the_router_joins_late() -> None:
    """Events published before the router subscribed (router restart, late join) are not lost
    even if the worker never publishes again."""
    with sim_testing.start_sim(speedup="inf", block_size=BS) as sim:
        async with httpx.AsyncClient() as client:
            for i in range(2):
                await _complete(client, sim.url, _prompt(i))
        async with _following(_record(sim)) as (hub, _):
            assert await eventually(lambda: all(_matched(hub, "sim-0", _prompt(i)) == 0 for i in range(2)))
            assert _matched(hub, "sim-0", _prompt(7)) < 0
            async with httpx.AsyncClient() as client:
                await _complete(client, sim.url, _prompt(3))  # live events still follow the replayed ones
            assert await eventually(lambda: _matched(hub, "sim-0", _prompt(3)) == 0)
            assert hub.cache_view("sim-0")["publishers"][0]["gaps"] == 0

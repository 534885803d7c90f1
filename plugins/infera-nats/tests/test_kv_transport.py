"""KV events through NATS: sim engines → relay → JetStream → router hubs, compared with the ZMQ path."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from infera_nats import kv_wire
from infera_nats.relay import KvRelay
from infera_nats.transport_factories import NatsKvEventTransport
from prometheus_client import CollectorRegistry
from relay_rig import relayed

from infera_core.kv.hub import KvHub
from infera_core.plugin.hooks import InferaHooks
from infera_core.testing.server import until
from infera_core.util.nats_server import NatsServer
from infera_core.worker import KvEventsInfo, WorkerRecord

sim_testing = pytest.importorskip("infera_sim.testing")
sim_tokenizer = pytest.importorskip("infera_sim.tokenizer")

BS = 16
MODEL = "sim-model"


def prompt(worker: int, i: int) -> str:
    shared = " ".join(f"sys{j}" for j in range(40))  # a prefix every worker has cached
    return f"{shared} worker {worker} question {i}: " + " ".join(f"w{worker}q{i}x{j}" for j in range(50))


def record(sim: object, worker_id: str, transport: str) -> WorkerRecord:
    kv = KvEventsInfo(
        endpoint=sim.kv_events_endpoint,  # type: ignore[attr-defined]
        replay_endpoint=sim.replay_endpoint,  # type: ignore[attr-defined]
        format="vllm",
        block_size=BS,
    )
    params = {"subject": kv_wire.kv_subject("infera", MODEL, worker_id)} if transport == "nats" else {}
    return WorkerRecord(
        worker_id=worker_id,
        url=sim.url,  # type: ignore[attr-defined]
        model=MODEL,
        engine="sim",
        kv_events=kv,
        kv_event_transport=transport,
        kv_event_params=params,
    )


def make_hub(nats: NatsServer, monkeypatch: pytest.MonkeyPatch) -> KvHub:
    monkeypatch.setenv("INFERA_NATS_URL", nats.url)
    catalog = InferaHooks.load().catalog()
    if "nats" not in catalog.kv_event_transports:
        catalog.kv_event_transports.add(NatsKvEventTransport(servers=nats.url))
    return KvHub(catalog, CollectorRegistry())


@contextlib.contextmanager
def sims(n: int) -> Iterator[list[object]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(sim_testing.start_sim(speedup="inf", block_size=BS)) for _ in range(n)]


@contextlib.asynccontextmanager
async def relays(engines: list[object], nats: NatsServer) -> AsyncIterator[list[KvRelay]]:
    out = []
    try:
        for i, sim in enumerate(engines):
            relay = KvRelay(f"w{i}", MODEL, record(sim, f"w{i}", "zmq").kv_events, nats.url)  # type: ignore[arg-type]
            await relay.start()
            out.append(relay)
        yield out
    finally:
        for relay in out:
            await relay.close()


def best_worker(hub: KvHub, workers: list[str], text: str) -> str | None:
    hashes = hub.index.hash_prompt(sim_tokenizer.SimTokenizer(32000).encode(text), BS)
    scores = hub.index.match(hashes, [hub.index.view(w, None) for w in workers])
    top = max(scores)
    return workers[scores.index(top)] if top > 0 else None


def fully_cached(hub: KvHub, prompts: list[str]) -> bool:
    """Every prompt's blocks are all on the worker that served it (its last events arrived)."""
    tokenizer = sim_tokenizer.SimTokenizer(32000)
    for text in prompts:
        worker = "w" + text.split(" worker ", 1)[1].split(" ", 1)[0]
        hashes = hub.index.hash_prompt(tokenizer.encode(text), BS)
        if hub.index.match(hashes, [hub.index.view(worker, None)])[0] < len(hashes):
            return False
    return True


def state(hub: KvHub, workers: list[str]) -> dict[str, set[int]]:
    return {w: (v.held() if (v := hub.index.view(w, None)) else set()) for w in workers}


async def drive(engines: list[object], per_worker: int) -> list[str]:
    prompts = []
    async with httpx.AsyncClient() as client:
        for i in range(per_worker):
            for w, sim in enumerate(engines):
                text = prompt(w, i)
                r = await client.post(
                    sim.url + "/v1/completions",  # type: ignore[attr-defined]
                    json={"model": MODEL, "prompt": text, "max_tokens": 1},
                )
                assert r.status_code == 200
                prompts.append(text)
    return prompts


async def test_nats_hubs_mirror_the_same_state_as_the_zmq_path(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    workers = ["w0", "w1"]
    with sims(2) as engines:
        async with relays(engines, nats_server):
            zmq_hub = make_hub(nats_server, monkeypatch)
            replicas = [make_hub(nats_server, monkeypatch) for _ in range(2)]
            for hub in (zmq_hub, *replicas):
                await hub.start()
            try:
                for w, sim in zip(workers, engines, strict=True):
                    zmq_hub.worker_added(record(sim, w, "zmq"))
                    for hub in replicas:
                        hub.worker_added(record(sim, w, "nats"))
                prompts = await drive(engines, 10)
                await until(
                    lambda: all(fully_cached(hub, prompts) for hub in (zmq_hub, *replicas)), within=15
                )
                expected = state(zmq_hub, workers)
                assert all(expected.values())
                assert all(state(h, workers) == expected for h in replicas)
                for hub in replicas:  # read from the stream, not from the engines' publishers
                    source = await hub.sources.get("nats")
                    assert source.messages > 0  # type: ignore[attr-defined]
                # a router that starts late rebuilds the same index from the stream
                late = make_hub(nats_server, monkeypatch)
                await late.start()
                try:
                    for w, sim in zip(workers, engines, strict=True):
                        late.worker_added(record(sim, w, "nats"))
                    await until(lambda: state(late, workers) == expected, within=15)
                    picks = [
                        tuple(best_worker(h, workers, p) for h in (zmq_hub, *replicas, late)) for p in prompts
                    ]
                    assert all(len(set(p)) == 1 for p in picks)
                    assert not late.cache_view("w0")["stale"]
                finally:
                    await late.close()
            finally:
                for hub in (zmq_hub, *replicas):
                    await hub.close()


async def test_relay_purges_its_subject_when_it_closes(nats_server: NatsServer) -> None:
    with sims(1) as engines:
        async with relays(engines, nats_server) as (relay,):
            await drive(engines, 2)
            await until(lambda: relay.batches > 0, within=10)
            assert relay.nc is not None
            js = relay.nc.jetstream()
            info = await js.stream_info(kv_wire.STREAM, subjects_filter=relay.subject)
            assert info.state.messages > 0
            nc = relay.nc
        # closed: the worker left, so its history is gone from the stream
        import nats

        other = await nats.connect(nats_server.url)
        try:
            info = await other.jetstream().stream_info(kv_wire.STREAM)
            assert info.state.messages == 0
        finally:
            await other.close()
        assert nc.is_closed


@pytest.mark.slow
async def test_kv_events_survive_a_nats_restart(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relay and routers reconnect on their own; the routers' consumers resume from the stream
    (kept on disk by the server) and catch up with what was published around the outage."""
    workers = ["w0"]
    with sims(1) as engines:
        async with relays(engines, nats_server) as (relay,):
            zmq_hub = make_hub(nats_server, monkeypatch)
            nats_hub = make_hub(nats_server, monkeypatch)
            for hub in (zmq_hub, nats_hub):
                await hub.start()
            try:
                zmq_hub.worker_added(record(engines[0], "w0", "zmq"))
                nats_hub.worker_added(record(engines[0], "w0", "nats"))
                before = await drive(engines, 3)
                await until(lambda: fully_cached(nats_hub, before), within=15)
                nats_server.restart()
                assert relay.nc is not None
                await until(lambda: relay.nc is not None and relay.nc.is_connected, within=15)
                more = [prompt(0, 100 + i) for i in range(3)]
                async with httpx.AsyncClient() as client:
                    for text in more:
                        r = await client.post(
                            engines[0].url + "/v1/completions",  # type: ignore[attr-defined]
                            json={"model": MODEL, "prompt": text, "max_tokens": 1},
                        )
                        assert r.status_code == 200
                await until(lambda: fully_cached(zmq_hub, before + more), within=15)
                await until(lambda: state(nats_hub, workers) == state(zmq_hub, workers), within=20)
                assert not nats_hub.cache_view("w0")["stale"]
            finally:
                for hub in (zmq_hub, nats_hub):
                    await hub.close()


async def test_malformed_kv_message_is_logged_with_its_subject_and_skipped(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with sims(1) as engines:
        async with relays(engines, nats_server) as (relay,):
            assert relay.nc is not None
            await relay.nc.publish(relay.subject, b"\x00\x01 truncated")  # into the stream, before any batch
            hub = make_hub(nats_server, monkeypatch)
            await hub.start()
            try:
                hub.worker_added(record(engines[0], "w0", "nats"))
                prompts = await drive(engines, 2)
                await until(lambda: fully_cached(hub, prompts), within=15)
                assert hub.cache_view("w0")["publishers"][0]["undecodable_batches"] == 1
                assert f"malformed KV message on {relay.subject} skipped" in caplog.text
            finally:
                await hub.close()


async def test_relay_passes_an_engine_restart_on(nats_server: NatsServer) -> None:
    """A restarted engine numbers its batches from 0 again: the relay publishes them all (routers
    see the restart and rebuild the view, as on the ZMQ path)."""

    def kv(port: int) -> KvEventsInfo:
        return KvEventsInfo(endpoint=f"tcp://127.0.0.1:{port}", format="vllm", block_size=BS)

    async with relayed(nats_server.url, "w0", MODEL, "vllm", kv, bind="tcp://127.0.0.1") as rig:

        def send(seq: int, payload: bytes) -> None:
            rig.pub.send_multipart([b"kv-events", seq.to_bytes(8, "big"), payload])

        await rig.until_subscribed(lambda: send(0, b"first-0"))
        for seq, payload in [(1, b"first-1"), (2, b"first-2"), (0, b"second-0"), (1, b"second-1")]:
            send(seq, payload)
        sink = rig.sink
        await until(lambda: len(sink.batches) >= 5 and sink.batches[-1][1] == b"second-1", within=10)
        assert sink.batches[-5:] == [
            (0, b"first-0"),
            (1, b"first-1"),
            (2, b"first-2"),
            (0, b"second-0"),
            (1, b"second-1"),
        ]
        assert rig.relay.restarts >= 1

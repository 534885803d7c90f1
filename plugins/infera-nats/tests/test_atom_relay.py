"""An ATOM worker's KV events over NATS: its publisher sends ``[topic, payload]`` with no seq frame
(``kv_events.seq_frames = False``); the worker's relay numbers the batches and publishes them all."""

from __future__ import annotations

from relay_rig import relayed

from infera_core.testing.server import until
from infera_core.util.nats_server import NatsServer
from infera_core.worker import KvEventsInfo

MODEL = "ds"


async def test_relay_numbers_an_atom_publishers_two_frame_messages(nats_server: NatsServer) -> None:
    def kv(port: int) -> KvEventsInfo:
        return KvEventsInfo(
            endpoint=f"tcp://127.0.0.1:{port}", format="atom", block_size=16, seq_frames=False
        )

    # bound on every interface, as ATOM binds ATOM_KV_EVENTS_ENDPOINT
    async with relayed(nats_server.url, "a0", MODEL, "atom", kv, bind="tcp://*") as rig:
        await rig.until_subscribed(lambda: rig.pub.send_multipart([b"kv-events", b"p0"]))
        for payload in (b"p1", b"p2"):
            rig.pub.send_multipart([b"kv-events", payload])
        sink = rig.sink
        await until(lambda: bool(sink.batches) and sink.batches[-1][1] == b"p2", within=10)
        seqs = [seq for seq, _ in sink.batches]
        assert seqs == list(range(len(seqs))), sink.batches  # 0, 1, 2…: no gap, no restart
        assert [p for _, p in sink.batches[-2:]] == [b"p1", b"p2"]
        assert rig.relay.restarts == 0

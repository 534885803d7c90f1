"""The KV event hub against hostile or broken publishers, over real ZMQ sockets.

Every test publishes raw multipart frames from a bare PUB socket on 127.0.0.1 and checks
what routing would see: the worker's view keeps following the stream (never wedged),
frames with an untrustworthy seq are counted and skipped, and a view that lost events is
cleared, marked stale and not credited by scorers until it has been refilled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest
import zmq

from infera_core.kv.events import BlockStored, KvEventBatch
from infera_core.kv.hub import KvHub
from infera_core.kv.settings import KvSettings
from infera_core.plugin.hooks import InferaHooks
from infera_core.util.net import free_port
from infera_core.worker import KvEventsInfo, Status, WorkerRecord

BS = 16
TOPIC = b"kv-events"
Publish = Callable[[list[bytes]], None]


def stored(*hashes: int) -> bytes:
    tokens = [h * BS + i for h in hashes for i in range(BS)]  # distinct blocks, distinct router hashes
    ev = BlockStored(list(hashes), None, tokens, BS)
    return msgspec.msgpack.encode(KvEventBatch(0.0, [ev], 0))


def seq(n: int, width: int = 8) -> bytes:
    return n.to_bytes(width, "big", signed=True)


class Publisher:
    """A bare ZMQ PUB socket and a hub following it as worker ``w``."""

    def __init__(self, hub: KvHub, pub: zmq.Socket[bytes]) -> None:
        self.hub = hub
        self.pub = pub

    def send(self, *frames: list[bytes]) -> None:
        for f in frames:
            self.pub.send_multipart(f)

    def pub_info(self) -> dict[str, Any]:
        return self.hub.cache_view("w")["publishers"][0]  # type: ignore[no-any-return]

    def blocks(self) -> int:
        view = self.hub.index.view("w", None)
        return -1 if view is None else view.block_count()

    def credited(self) -> bool:
        return ("w", None) in self.hub.index.views_by_key

    async def joined(self) -> None:
        """Publish a probe until the SUB socket is connected (ZMQ joins asynchronously), then
        restart the stream: every test starts from an empty, credited view at seq 0."""
        async with asyncio.timeout(10):
            while self.blocks() < 1:
                self.send([TOPIC, seq(0), stored(1)])
                await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def publisher(**settings: Any) -> AsyncIterator[Publisher]:
    port = free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://127.0.0.1:{port}")
    hub = KvHub(InferaHooks.load().catalog(), None, KvSettings(**settings))
    await hub.start()
    hub.worker_added(
        WorkerRecord(
            worker_id="w",
            url="http://127.0.0.1:9",
            model="m",
            engine="vllm",
            kv_events=KvEventsInfo(endpoint=f"tcp://127.0.0.1:{port}", format="vllm", block_size=BS),
        )
    )
    try:
        p = Publisher(hub, pub)
        await p.joined()
        yield p
    finally:
        await hub.close()
        pub.close(0)
        ctx.term()


async def until(cond: Callable[[], bool], within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        while not cond():  # noqa: ASYNC110 (state of another socket's reader)
            await asyncio.sleep(0.02)


async def test_a_negative_first_seq_is_skipped_and_the_stream_goes_on() -> None:
    async with publisher() as p:
        p.send([TOPIC, seq(-5), stored(2)], [TOPIC, seq(1), stored(3)], [TOPIC, seq(2), stored(4)])
        await until(lambda: p.blocks() == 3)  # 1, 3 and 4: never wedged
        info = p.pub_info()
        assert info["bad_seq_frames"] == 1 and info["last_seq"] == 2
        assert p.credited() and not info["stale"]


async def test_negative_seqs_later_in_the_stream_are_skipped() -> None:
    async with publisher() as p:
        p.send(*([TOPIC, seq(-1 - i), stored(100 + i)] for i in range(5)))
        p.send([TOPIC, seq(1), stored(5)])
        await until(lambda: p.blocks() == 2)
        assert p.pub_info()["bad_seq_frames"] == 5 and p.credited()


@pytest.mark.parametrize("width", [0, 4, 7, 9, 11, 16])
async def test_a_seq_frame_of_the_wrong_length_is_skipped_without_clearing_the_view(width: int) -> None:
    async with publisher() as p:
        p.send([TOPIC, b"\x01" * width, stored(7)])  # 11 bytes of 0x01 read as seq 1.2e24
        p.send([TOPIC, seq(1), stored(8)])
        await until(lambda: p.blocks() == 2)  # 1 and 8: the view was never cleared
        info = p.pub_info()
        assert info["bad_seq_frames"] == 1 and info["last_seq"] == 1 and not info["stale"]


async def test_a_batch_that_cannot_be_decoded_leaves_the_view_stale_and_uncredited() -> None:
    async with publisher(kv_refill_s=0.3) as p:
        p.send([TOPIC, seq(1), b"\xc1 not msgpack"])
        await until(lambda: p.pub_info()["stale"])
        assert not p.credited() and p.blocks() == 0  # events were lost: nothing is trusted
        p.send([TOPIC, seq(2), stored(9)])
        await until(lambda: p.blocks() == 1)
        assert not p.credited()  # refilling, not yet trusted
        await asyncio.sleep(0.35)
        p.send([TOPIC, seq(3), stored(10)])
        await until(lambda: p.credited() and not p.pub_info()["stale"])
        assert p.blocks() == 2


async def test_any_exception_in_one_batch_never_wedges_the_subscription(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with publisher() as p:
        real = p.hub.ingest.apply
        boom = [True]

        def apply_once_broken(sub: Any, s: int, payload: bytes) -> None:
            if boom:
                boom.clear()
                raise OverflowError("whatever a batch may raise")
            real(sub, s, payload)

        monkeypatch.setattr(p.hub.ingest, "apply", apply_once_broken)
        p.send([TOPIC, seq(1), stored(11)], [TOPIC, seq(2), stored(12)])
        await until(lambda: p.pub_info()["last_seq"] == 2)  # 12 applied after 11 blew up
        assert p.blocks() == 1  # the failed batch cleared the view: 12 alone
        info = p.pub_info()
        assert info["undecodable_batches"] == 1 and info["stale"] and not p.credited()


async def test_a_message_over_the_size_limit_is_refused_and_its_events_count_as_lost() -> None:
    async with publisher(kv_max_message_bytes=64 * 1024) as p:
        huge = stored(*range(1000, 1000 + 3000))  # ~100 KB of events
        assert len(huge) > 64 * 1024
        p.send([TOPIC, seq(1), huge])
        t0 = time.monotonic()
        n = 2
        while p.pub_info()["last_seq"] in (None, 0, 1):
            # ZMQ dropped the connection on the big frame and reconnects: keep publishing
            p.send([TOPIC, seq(n), stored(5)])
            n += 1
            await asyncio.sleep(0.02)
            assert time.monotonic() - t0 < 10
        assert p.blocks() < 10  # the big batch's 3000 blocks never landed
        assert p.pub_info()["stale"]  # the gap it left was not replayable


def test_the_size_limit_has_a_sane_default() -> None:
    assert KvSettings().kv_max_message_bytes == 16 * 1024 * 1024


LOST = "events in between count as lost"


async def test_a_publisher_that_goes_away_while_followed_counts_its_events_as_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with publisher() as p:
        p.pub.close(0)
        await until(lambda: LOST in caplog.text)
        assert p.hub.subs["w"][0].drops >= 1


async def test_publishers_stopped_after_stop_following_are_no_loss(caplog: pytest.LogCaptureFixture) -> None:
    """An orderly stop (``up`` / ``bench --compare`` ending) unfollows before the engines go."""
    async with publisher() as p:
        await p.hub.stop_following()
        assert p.hub.subs == {}
        p.pub.close(0)
        p.hub.worker_added(  # nor is a worker (re)joining meanwhile followed again
            WorkerRecord(
                worker_id="w2",
                url="http://127.0.0.1:9",
                model="m",
                engine="vllm",
                kv_events=KvEventsInfo(
                    endpoint=f"tcp://127.0.0.1:{free_port()}", format="vllm", block_size=BS
                ),
            )
        )
        assert p.hub.subs == {}
    assert LOST not in caplog.text


async def test_a_publisher_that_goes_away_while_its_worker_drains_is_no_loss(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker stopping in order (``worker`` on SIGTERM, seen by a router elsewhere) publishes
    ``draining`` before its engine stops: the socket closing then is expected, not a warning."""
    caplog.set_level(logging.INFO, logger="infera.kv.hub")
    async with publisher() as p:
        record = p.hub.records["w"]
        p.hub.worker_added(record.model_copy(update={"status": Status.DRAINING}))
        p.pub.close(0)
        await until(lambda: p.hub.subs["w"][0].drops >= 1)
        assert "closed while the worker drains" in caplog.text
    assert LOST not in caplog.text

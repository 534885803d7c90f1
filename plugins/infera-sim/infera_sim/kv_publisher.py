"""KV events on the wire, the way vLLM 0.32 publishes them.

* PUB socket bound to ``tcp://<host>:<port>``; frames ``[topic, seq (8 bytes BE), payload]``.
* payload: msgpack ``[ts, events, dp_rank]``; each event a map tagged ``"type"`` with
  vLLM 0.32's fields (``--kv-events-layout map``), or a tagged array
  ``["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium]`` (``array``,
  older vLLM / SGLang).
* Replay: ROUTER socket; a DEALER sends ``[b"", start_seq]`` and gets
  ``[b"", topic, seq, payload]`` per buffered batch with ``seq >= start_seq``, then
  ``[b"", b"", -1 (8 bytes, signed), b""]``.
* Faults (``--fault-kv-*``) act like a lossy network in front of a correct publisher:
  every batch still enters the replay buffer with its sequence number.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from infera_core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from infera_core.util.kv_replay import serve_replay

log = logging.getLogger("infera_sim.kv")


def _log_invalid_replay(frames: int) -> None:
    log.warning("kv replay: invalid request with %d frames", frames)


class _Stored(msgspec.Struct):
    """BlockStored's fields in both layouts (vLLM's array frames, the map form)."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class _Removed(msgspec.Struct):
    block_hashes: list[int]
    medium: str | None


class MapBlockStored(_Stored, tag="BlockStored", tag_field="type"):
    lora_name: str | None
    extra_keys: list[Any]
    group_idx: int
    kv_cache_spec_kind: str


class MapBlockRemoved(_Removed, tag="BlockRemoved", tag_field="type"):
    group_idx: int


class MapAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type"):
    pass


class ArrayBlockStored(_Stored, tag="BlockStored", array_like=True):
    pass


class ArrayBlockRemoved(_Removed, tag="BlockRemoved", array_like=True):
    pass


class ArrayAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True):
    pass


def _hash(h: int | bytes) -> int:
    return h if isinstance(h, int) else int.from_bytes(h[-8:], "big")


def wire_event(event: KvEvent, layout: str) -> msgspec.Struct:
    """The msgspec struct that encodes ``event`` in ``layout`` (``map`` or ``array``)."""
    if isinstance(event, BlockStored):
        hashes = [_hash(h) for h in event.block_hashes]
        parent = None if event.parent_block_hash is None else _hash(event.parent_block_hash)
        if layout == "array":
            return ArrayBlockStored(
                hashes, parent, event.token_ids, event.block_size, event.lora_id, event.medium
            )
        return MapBlockStored(
            hashes,
            parent,
            event.token_ids,
            event.block_size,
            event.lora_id,
            event.medium,
            event.lora_name,
            event.extra_keys or [None] * len(hashes),
            0,
            "full_attention",
        )
    if isinstance(event, BlockRemoved):
        hashes = [_hash(h) for h in event.block_hashes]
        if layout == "array":
            return ArrayBlockRemoved(hashes, event.medium)
        return MapBlockRemoved(hashes, event.medium, 0)
    if isinstance(event, AllBlocksCleared):
        return ArrayAllBlocksCleared() if layout == "array" else MapAllBlocksCleared()
    raise TypeError(f"not a KV event: {event!r}")


def encode_batch(ts: float, events: list[KvEvent], dp_rank: int | None, layout: str) -> bytes:
    return msgspec.msgpack.encode((ts, [wire_event(e, layout) for e in events], dp_rank))


class KvPublisher:
    """PUB + replay ROUTER sockets; call :meth:`publish` once per engine step."""

    def __init__(
        self,
        host: str = "*",
        port: int = 0,
        replay_port: int | None = None,
        *,
        topic: str = "kv-events",
        layout: str = "map",
        dp_rank: int | None = 0,
        buffer: int = 10000,
        drop_rate: float = 0.0,
        duplicate_rate: float = 0.0,
        reorder: bool = False,
        seed: int = 0,
    ) -> None:
        self.sync_ctx = zmq.Context()
        self.ctx = zmq.asyncio.Context.shadow(self.sync_ctx)
        self.topic = topic.encode()
        self.layout = layout
        self.dp_rank = dp_rank
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=max(1, buffer))
        self.drop_rate = drop_rate
        self.duplicate_rate = duplicate_rate
        self.reorder = reorder
        self._held: list[bytes] | None = None
        self._rng = random.Random(seed)
        self.pub: zmq.Socket[bytes] = self.sync_ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 100000)
        self.replay: zmq.asyncio.Socket | None = None
        self.replay_port: int | None = None
        self._task: asyncio.Task[None] | None = None
        try:
            self.port = self._bind(self.pub, host, port)
            if replay_port is not None:
                self.replay = self.ctx.socket(zmq.ROUTER)
                self.replay.setsockopt(zmq.LINGER, 0)
                self.replay_port = self._bind(self.replay, host, replay_port)
        except zmq.ZMQError:
            self.close()  # a port taken: leave no socket behind (a context with one never terminates)
            raise

    @staticmethod
    def _bind(sock: Any, host: str, port: int) -> int:
        if port == 0:
            return int(sock.bind_to_random_port(f"tcp://{host}"))
        sock.bind(f"tcp://{host}:{port}")
        return port

    def start(self) -> None:
        """Start answering replay requests (needs a running event loop)."""
        if self.replay is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    def publish(self, ts: float, events: list[KvEvent]) -> int:
        """Encode and send one batch; returns its sequence number."""
        seq = self.seq
        self.seq += 1
        payload = encode_batch(time.time() if ts <= 0 else ts, events, self.dp_rank, self.layout)
        self.buffer.append((seq, payload))
        frames = [self.topic, seq.to_bytes(8, "big"), payload]
        rng = self._rng
        if self.drop_rate and rng.random() < self.drop_rate:
            return seq
        if self.reorder:
            if self._held is None:
                self._held = frames
                return seq
            held, self._held = self._held, None
            self._send(frames)
            self._send(held)
            return seq
        self._send(frames)
        if self.duplicate_rate and rng.random() < self.duplicate_rate:
            self._send(frames)
        return seq

    def _send(self, frames: list[bytes]) -> None:
        try:
            self.pub.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("kv events: PUB queue full, batch dropped")

    def flush_held(self) -> None:
        """Send a batch held back by ``--fault-kv-reorder`` (at shutdown)."""
        if self._held is not None:
            held, self._held = self._held, None
            self._send(held)

    async def _serve_replay(self) -> None:
        assert self.replay is not None
        await serve_replay(self.replay, self.topic, lambda: list(self.buffer), _log_invalid_replay)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.pub.close(0)
        if self.replay is not None:
            self.replay.close(0)
        self.sync_ctx.term()

"""ATOM's native KV event publisher: how the adapter turns it on, and the ``atom`` decoder.

Checked against ROCm/ATOM ``main`` at ffdf3bb5 (2026-08-22): ``atom/distributed/kv_events.py``
(the publisher and event structs, added in de2d85de, #869), ``atom/utils/envs.py`` and
``atom/config.py`` (``KVEventsConfig.from_env``), ``atom/model_engine/scheduler.py`` (one
publisher per engine-core scheduler, ``data_parallel_rank`` from its parallel config) and
``atom/model_engine/block_manager.py`` (what it emits).

* **Switch**: environment only — ATOM has no CLI flag for it. ``ATOM_KV_EVENTS_ENABLE=1``,
  ``ATOM_KV_EVENTS_PUBLISHER=zmq``, ``ATOM_KV_EVENTS_ENDPOINT`` (default
  ``tcp://127.0.0.1:5557``; ATOM always **binds** it, so the adapter passes ``tcp://*:<free
  port>``), ``ATOM_KV_EVENTS_TOPIC`` (default empty), ``ATOM_KV_EVENTS_HWM``,
  ``ATOM_KV_EVENTS_BUFFER_STEPS``. Events exist only with prefix caching (ATOM's default).
  Every engine core (one per DP rank under ``-dp N``) makes its own publisher on that one
  endpoint, so with ``-dp`` > 1 only the first could bind: the adapter leaves events off there
  (routing falls back to load for that worker) rather than break ranks 1…N−1.
* **Frames**: a PUB socket sending ``[topic, payload]`` when the topic is set, a single
  ``[payload]`` frame when it is empty — **no sequence frame and no replay socket** (unlike
  vLLM's ``[topic, seq, payload]``). The record says so (``seq_frames=False``): the hub numbers
  the batches itself, and a dropped connection clears the view (lost events cannot be seen).
  An unmerged ATOM branch (757925479b, "add replay buffer knob") sends vLLM's three frames;
  the hub reads those too.
* **Payload**: msgpack ``[ts, events, data_parallel_rank]`` (msgspec ``array_like`` structs;
  their ``omit_defaults`` does not shorten arrays, msgspec 0.23 checked). Events are **tagged
  arrays**, not vLLM ≥ 0.24's maps: ``[tag, block_hashes, parent_block_hash, token_ids,
  block_size, lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
  kv_cache_spec_sliding_window]`` (shorter arrays are read too, missing fields as defaults).
  ``["BlockRemoved", hashes, medium, group_idx]``, ``["AllBlocksCleared", medium]`` and the
  ATOM-only ``["BlockTransferred", hashes, from_medium, to_medium, group_idx]`` (a tier move;
  read here as "gone from ``from_medium``": the router credits less, never more).
* **Hashes**: ``xxh64`` digests as unsigned ints, chained over the parent; a run of blocks per
  ``BlockStored`` with all their token ids (``block_size`` tokens each unless decode context
  parallelism widens the hash block). ``medium="REMOTE"`` (blocks a PD decode worker received)
  counts at the disk tier's weight.
"""

from __future__ import annotations

from typing import Any

import msgspec

from infera_atom.parallel import dp_master_env, dp_size, launch_port
from infera_core.engines.base import LaunchContext
from infera_core.engines.support import bracket_host
from infera_core.kv.events import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KvDecodeError,
    KvEvent,
    KvEventBatch,
)
from infera_core.worker import KvEventsInfo

FORMAT = "atom"
KV_TOPIC = "kv-events"
_U64 = (1 << 64) - 1


def kv_event_env(port: int, topic: str = KV_TOPIC) -> dict[str, str]:
    """The environment that turns ATOM's publisher on, bound on ``port`` (all interfaces)."""
    return {
        "ATOM_KV_EVENTS_ENABLE": "1",
        "ATOM_KV_EVENTS_PUBLISHER": "zmq",
        "ATOM_KV_EVENTS_ENDPOINT": f"tcp://*:{port}",
        "ATOM_KV_EVENTS_TOPIC": topic,
    }


class _Batch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Any]
    dp_rank: int | None = None


def _hash(h: Any) -> BlockHash:
    if isinstance(h, int) and not isinstance(h, bool):
        return h & _U64
    if isinstance(h, bytes):
        return h
    raise KvDecodeError(f"block hash of type {type(h).__name__} is not an int")


def _hashes(v: Any) -> list[BlockHash]:
    if not isinstance(v, list):
        raise KvDecodeError("block_hashes is not a list")
    return [_hash(h) for h in v]


def _at(ev: list[Any], i: int, kind: type) -> Any:
    """Field ``i`` of an array event when present and of ``kind`` (trailing defaults are left out)."""
    v = ev[i] if len(ev) > i else None
    return v if isinstance(v, kind) and not isinstance(v, bool) else None


def wire_event(ev: Any) -> KvEvent | None:
    """One ATOM event (a tagged array) as a normalized event; None for an unknown tag."""
    if not isinstance(ev, list) or not ev:
        return None
    tag = ev[0]
    if tag == "BlockStored":
        if len(ev) < 5 or not isinstance(ev[4], int) or not isinstance(ev[3], list):
            raise KvDecodeError("BlockStored needs [tag, hashes, parent, token_ids, block_size, …]")
        if not all(type(t) is int for t in ev[3]):
            raise KvDecodeError("BlockStored token_ids are not all ints")
        parent = ev[2]
        return BlockStored(
            _hashes(ev[1]),
            None if parent is None else _hash(parent),
            ev[3],
            ev[4],
            _at(ev, 5, int),
            _at(ev, 6, str) or "GPU",
            _at(ev, 10, str),
            _at(ev, 9, int),
            _at(ev, 7, str),
            _at(ev, 8, list),
        )
    if tag == "BlockRemoved":
        if len(ev) < 2:
            raise KvDecodeError("BlockRemoved needs [tag, hashes, …]")
        return BlockRemoved(_hashes(ev[1]), _at(ev, 2, str) or "GPU", _at(ev, 3, int))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if tag == "BlockTransferred":
        if len(ev) < 4 or not isinstance(ev[2], str):
            raise KvDecodeError("BlockTransferred needs [tag, hashes, from_medium, to_medium, …]")
        return BlockRemoved(_hashes(ev[1]), ev[2], _at(ev, 4, int))
    return None


class AtomEventDecoder:
    """Decodes ATOM's payloads (``kv_events.format = "atom"``); counts what it skips."""

    __slots__ = ("_decoder", "name", "transfers", "unknown_events")

    def __init__(self) -> None:
        self.name = FORMAT
        self._decoder = msgspec.msgpack.Decoder(_Batch)
        self.unknown_events = 0
        self.transfers = 0
        """``BlockTransferred`` events, applied as removals from their source tier."""

    def decode(self, payload: bytes) -> KvEventBatch:
        try:
            batch = self._decoder.decode(payload)
        except msgspec.DecodeError as exc:
            raise KvDecodeError(f"not an ATOM KV event batch: {exc}") from None
        events: list[KvEvent] = []
        for raw in batch.events:
            ev = wire_event(raw)
            if ev is None:
                self.unknown_events += 1
                continue
            if isinstance(raw, list) and raw[0] == "BlockTransferred":
                self.transfers += 1
            events.append(ev)
        return KvEventBatch(batch.ts, events, batch.dp_rank)


def kv_events_port(ctx: LaunchContext) -> int:
    """The port ATOM's publisher binds (``--kv-events-port``, else a free one, picked once)."""
    return launch_port(ctx, "atom_kv_events", "kv_events_port")


def engine_port_flags(ctx: LaunchContext) -> list[str]:
    """ATOM's ``--port`` (its internal engine port, default 8006: torch.distributed's
    ``MASTER_PORT``), a free one per launch so two ATOM workers on one host do not collide.
    A ``--port`` after ``--`` is the user's and is passed as given."""
    if any(a == "--port" or a.startswith("--port=") for a in ctx.engine_args):
        return []
    return ["--port", str(launch_port(ctx, "atom_engine", "engine_port"))]


def launch_env(ctx: LaunchContext) -> dict[str, str]:
    """The engine's environment: the publisher's (not under ATOM DP: main binds every rank's
    publisher to the one ``ATOM_KV_EVENTS_ENDPOINT``, so the second rank could not bind) and,
    under DP, the ranks' rendezvous port (:func:`infera_atom.parallel.dp_master_env`)."""
    if dp_size(ctx) > 1:
        return dp_master_env(ctx)
    return kv_event_env(kv_events_port(ctx))


def kv_events_info(ctx: LaunchContext, block_size: int) -> KvEventsInfo | None:
    """What the worker record advertises: the publisher's address, the ``atom`` decoder, no seq
    frames (None under ATOM DP, where the publisher stays off: :func:`launch_env`)."""
    if dp_size(ctx) > 1:
        return None
    return KvEventsInfo(
        endpoint=f"tcp://{bracket_host(ctx.advertise_host)}:{kv_events_port(ctx)}",
        format=FORMAT,
        block_size=block_size,
        topic=KV_TOPIC,
        seq_frames=False,
    )

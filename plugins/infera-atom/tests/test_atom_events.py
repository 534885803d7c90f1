"""ATOM's native KV events and internal port: launch env/argv, the record, the ``atom`` decoder
against frames shaped as ATOM's publisher emits them, and the hub following such a publisher.

The wire shapes come from ROCm/ATOM main ffdf3bb5 (``atom/distributed/kv_events.py``): msgspec
structs with ``array_like=True, omit_defaults=True, tag=True`` (events) and ``array_like=True,
omit_defaults=True`` (the batch), sent as ``[topic, payload]`` on a PUB socket — no seq frame.
The structs below declare the same fields, defaults and options, so msgspec encodes the bytes
ATOM does (every field: ``omit_defaults`` does not shorten array-like structs); a second test
spells the arrays out by hand, shorter ones included.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import zmq
from atom_golden import ATOM_WORKER
from infera_atom.adapter import AtomAdapter
from infera_atom.kv_events import AtomEventDecoder

from infera_core.engines.base import LaunchContext
from infera_core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from infera_core.kv.hub import KvHub
from infera_core.kv.settings import KvSettings
from infera_core.plugin.hooks import InferaHooks
from infera_core.testing.engine_env import flag, launch_context
from infera_core.testing.server import eventually
from infera_core.worker import WorkerRecord

BS = 16


# -- ATOM's wire structs (field names, order, defaults and struct options as in its source) ---------
class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class AtomBlockStored(KVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = "GPU"
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class AtomBlockRemoved(KVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = "GPU"
    group_idx: int | None = None


class AtomAllBlocksCleared(KVCacheEvent, tag="AllBlocksCleared"):
    medium: str | None = None


class AtomBlockTransferred(KVCacheEvent, tag="BlockTransferred"):
    block_hashes: list[int]
    from_medium: str
    to_medium: str
    group_idx: int | None = None


class AtomEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[AtomBlockStored | AtomBlockRemoved | AtomAllBlocksCleared | AtomBlockTransferred]
    data_parallel_rank: int | None = None


def _tokens(n_blocks: int, start: int = 1) -> list[int]:
    return list(range(start, start + n_blocks * BS))


# -- launch ------------------------------------------------------------------------------------
def ctx(**kw: object) -> LaunchContext:
    options = {"tp": 1, "block_size": BS, "handshake_port": 0, "engine_port": 0, "kv_events_port": 0}
    return launch_context({**ATOM_WORKER, "options": options}, **kw)  # real free ports: bound below


def test_atom_publishes_kv_events_and_the_record_names_the_atom_decoder(atom_python: str) -> None:
    adapter = AtomAdapter()
    c = ctx(engine_python=atom_python)
    spec = adapter.build_launch(c)
    port = int(spec.env["ATOM_KV_EVENTS_ENDPOINT"].rsplit(":", 1)[1])
    assert spec.env == {
        "ATOM_KV_EVENTS_ENABLE": "1",
        "ATOM_KV_EVENTS_PUBLISHER": "zmq",
        "ATOM_KV_EVENTS_ENDPOINT": f"tcp://*:{port}",  # ATOM binds it
        "ATOM_KV_EVENTS_TOPIC": "kv-events",
    }
    kv = adapter.record_fields(c).kv_events
    assert kv is not None
    assert (kv.endpoint, kv.format, kv.block_size, kv.topic) == (
        f"tcp://10.0.0.9:{port}",
        "atom",
        BS,
        "kv-events",
    )
    assert kv.seq_frames is False and kv.replay_endpoint is None  # ATOM main: no seq frame, no replay


def test_each_atom_worker_gets_its_own_internal_port(atom_python: str) -> None:
    adapter = AtomAdapter()
    ports = []
    for worker in ("a1", "a2"):
        c = ctx(worker_id=worker, engine_python=atom_python)
        argv = adapter.build_launch(c).argv
        assert argv.count("--port") == 1
        ports.append(int(flag(argv, "--port")))
        assert flag(argv, "--server-port") == "8888"  # the HTTP port stays --server-port
        assert adapter.engine_flags(c) == argv[3:]  # picked once per launch
    assert ports[0] != ports[1] and 8006 not in ports
    fixed = adapter.engine_flags(ctx(options={"tp": 1, "block_size": BS, "engine_port": 29123}))
    assert flag(fixed, "--port") == "29123"
    users = adapter.engine_flags(ctx(engine_args=["--port", "9000"]))
    assert users.count("--port") == 1 and flag(users, "--port") == "9000"


@pytest.mark.parametrize(
    "dp_args", [["-dp", "2"], ["--data-parallel-size=4"], ["--enable-dp-attention", "-dp", "8"]]
)
def test_atom_data_parallel_keeps_its_publisher_off(atom_python: str, dp_args: list[str]) -> None:
    """Each ATOM DP rank's engine core binds ATOM_KV_EVENTS_ENDPOINT itself: only one could."""
    adapter = AtomAdapter()
    c = ctx(engine_python=atom_python, engine_args=dp_args)
    spec = adapter.build_launch(c)
    assert not any(k.startswith("ATOM_KV_EVENTS") for k in spec.env)
    assert adapter.record_fields(c).kv_events is None
    assert spec.argv[-len(dp_args) :] == dp_args
    one = ctx(engine_python=atom_python, engine_args=["-dp", "1"])
    assert adapter.build_launch(one).env["ATOM_KV_EVENTS_ENABLE"] == "1"


# -- decoder -------------------------------------------------------------------------------------
def test_decoder_reads_frames_encoded_as_atoms_publisher_does() -> None:
    tokens = _tokens(2)
    batch = AtomEventBatch(
        ts=1.5,
        events=[
            AtomBlockStored(
                block_hashes=[2**64 - 5, 7], parent_block_hash=None, token_ids=tokens, block_size=BS
            ),
            AtomBlockStored(
                block_hashes=[9],
                parent_block_hash=7,
                token_ids=_tokens(1, 100),
                block_size=BS,
                medium="REMOTE",
            ),
            AtomBlockRemoved(block_hashes=[7]),
            AtomBlockTransferred(block_hashes=[9], from_medium="GPU", to_medium="CPU"),
            AtomAllBlocksCleared(),
        ],
        data_parallel_rank=None,
    )
    payload = msgspec.msgpack.encode(batch)
    raw = msgspec.msgpack.decode(payload)
    # msgspec writes every field of an array-like struct (omit_defaults does not shorten arrays)
    assert raw[0] == 1.5 and raw[2] is None
    assert raw[1][0] == [
        "BlockStored",
        [2**64 - 5, 7],
        None,
        tokens,
        BS,
        None,
        "GPU",
        None,
        None,
        None,
        None,
        None,
    ]
    assert raw[1][3] == ["BlockTransferred", [9], "GPU", "CPU", None]
    decoder = AtomEventDecoder()
    out = decoder.decode(payload)
    assert out.ts == 1.5 and out.dp_rank is None
    stored, remote, removed, moved, cleared = out.events
    assert isinstance(stored, BlockStored)
    assert (stored.block_hashes, stored.parent_block_hash, stored.token_ids, stored.block_size) == (
        [2**64 - 5, 7],
        None,
        tokens,
        BS,
    )
    assert stored.medium == "GPU" and stored.lora_id is None
    assert isinstance(remote, BlockStored) and remote.medium == "REMOTE" and remote.parent_block_hash == 7
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == [7] and removed.medium == "GPU"
    assert isinstance(moved, BlockRemoved) and moved.block_hashes == [9] and moved.medium == "GPU"
    assert isinstance(cleared, AllBlocksCleared)
    assert decoder.transfers == 1 and decoder.unknown_events == 0


def test_decoder_reads_hand_built_arrays_with_every_field_and_a_dp_rank() -> None:
    tokens = _tokens(1)
    full = ["BlockStored", [11], 10, tokens, BS, 3, "CPU", "lora-a", [["lora-a"]], 0, "full_attention", None]
    payload = msgspec.msgpack.encode(
        [2.0, [full, ["BlockRemoved", [11], "CPU", 0], ["SomethingNew", 1], ["AllBlocksCleared", "GPU"]], 1]
    )
    decoder = AtomEventDecoder()
    out = decoder.decode(payload)
    assert out.dp_rank == 1
    stored, removed, cleared = out.events
    assert isinstance(stored, BlockStored)
    assert (stored.lora_id, stored.medium, stored.group_idx, stored.kv_cache_spec_kind) == (
        3,
        "CPU",
        0,
        "full_attention",
    )
    assert (stored.lora_name, stored.extra_keys) == ("lora-a", [["lora-a"]])  # its chain's namespace
    assert isinstance(removed, BlockRemoved) and removed.medium == "CPU"
    assert isinstance(cleared, AllBlocksCleared)
    assert decoder.unknown_events == 1


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",
        msgspec.msgpack.encode({"ts": 1}),
        msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, [1, 2]]]]),  # no block_size
        msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, ["a"], BS]]]),
        msgspec.msgpack.encode([1.0, [["BlockRemoved", ["x"]]]]),
    ],
)
def test_decoder_refuses_malformed_batches_with_a_decode_error(payload: bytes) -> None:
    from infera_core.kv.events import KvDecodeError

    with pytest.raises(KvDecodeError):
        AtomEventDecoder().decode(payload)


# -- the hub following an ATOM-shaped publisher (real ZMQ, no seq frame) --------------------------
async def test_hub_follows_atom_two_frame_publisher(atom_python: str) -> None:
    adapter = AtomAdapter()
    c = ctx(engine_python=atom_python, advertise_host="127.0.0.1")
    spec = adapter.build_launch(c)
    fields = adapter.record_fields(c)
    record = WorkerRecord(
        worker_id="atom-0", url="http://127.0.0.1:8888", model="ds", engine="atom", kv_events=fields.kv_events
    )
    zctx = zmq.Context()
    pub = zctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(spec.env["ATOM_KV_EVENTS_ENDPOINT"])  # as ATOM's ZmqEventPublisher does
    topic = spec.env["ATOM_KV_EVENTS_TOPIC"].encode()
    hub = KvHub(InferaHooks.load().catalog(), None, KvSettings())
    await hub.start()
    try:
        hub.worker_added(record)
        tokens = _tokens(4)
        stored = AtomBlockStored(
            block_hashes=[1, 2, 3, 4], parent_block_hash=None, token_ids=tokens, block_size=BS
        )

        def matched() -> int:
            view = hub.index.view("atom-0", None)
            if view is None:
                return 0
            return int(hub.index.match(hub.index.hash_prompt(tokens, BS), [view])[0])

        async def sendeventually(events: list[Any], cond: Callable[[], bool]) -> bool:
            # a PUB drops what it sends before the SUB is connected: resend until it shows
            for _ in range(100):
                pub.send_multipart(
                    [topic, msgspec.msgpack.encode(AtomEventBatch(ts=time.time(), events=events))]
                )
                if await eventually(cond, 0.1):
                    return True
            return False

        assert await sendeventually([stored], lambda: matched() == 4)
        sub = hub.subs["atom-0"][0]
        assert sub.undecodable == 0 and sub.bad_seq == 0 and sub.gaps == 0
        assert await sendeventually([AtomBlockRemoved(block_hashes=[3])], lambda: matched() == 2)
        assert sub.last_seq is not None and sub.last_seq >= 1  # numbered by the hub
    finally:
        await hub.close()
        pub.close(0)
        zctx.term()

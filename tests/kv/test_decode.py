"""The vLLM-style decoder on real recorded frames and on synthetic SGLang/array payloads."""

from __future__ import annotations

import msgspec
import pytest
from kv_recorded import RECORDINGS, frames

from infera_core.kv.decode import MsgpackEventDecoder
from infera_core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KvDecodeError


@pytest.mark.parametrize("name", RECORDINGS)
def test_decodes_every_recorded_vllm_frame(name: str) -> None:
    dec = MsgpackEventDecoder("vllm")
    for rec in frames(name):
        batch = dec.decode(rec["payload"])
        ts, events, dp_rank = rec["batch"]
        assert batch.ts == pytest.approx(ts)
        assert batch.dp_rank == dp_rank
        assert len(batch.events) == len(events)
        for got, want in zip(batch.events, events, strict=True):
            assert type(got).__name__ == want["type"]
            if isinstance(got, BlockStored):
                assert got.block_hashes == want["block_hashes"]
                assert got.parent_block_hash == want["parent_block_hash"]
                assert got.token_ids == want["token_ids"]
                assert got.block_size == want["block_size"] == 32
                assert got.medium == "GPU"
                assert got.kv_cache_spec_kind == "full_attention"
                assert len(got.token_ids) == len(got.block_hashes) * got.block_size
            elif isinstance(got, BlockRemoved):
                assert got.block_hashes == want["block_hashes"]
    assert dec.slow_batches == 0  # the real format takes the fast path


def test_old_array_layout_decodes() -> None:
    toks = list(range(64))
    payload = msgspec.msgpack.encode(
        [
            5.0,
            [
                ["BlockStored", [11, 12], None, toks, 32, None, "GPU"],
                ["BlockRemoved", [11], "GPU"],
                ["AllBlocksCleared"],
            ],
            None,
        ]
    )
    batch = MsgpackEventDecoder("vllm").decode(payload)
    stored, removed, cleared = batch.events
    assert isinstance(stored, BlockStored) and stored.block_hashes == [11, 12] and stored.token_ids == toks
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == [11]
    assert isinstance(cleared, AllBlocksCleared)
    assert batch.dp_rank is None


def test_sglang_signed_hashes_bigram_pairs_and_extras() -> None:
    pairs = [[i, i + 1] for i in range(32)]
    payload = msgspec.msgpack.encode(
        [
            1.0,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [-2],
                    "parent_block_hash": -3,
                    "token_ids": pairs,
                    "block_size": 32,
                    "lora_id": None,
                    "medium": "CPU_PINNED",
                    "cache_salt": "s",
                    "session_id": "abc",
                    "lora_name": None,
                },
                {"type": "BlockRemoved", "block_hashes": [-2], "medium": "EXTERNAL"},
            ],
            2,
        ]
    )
    batch = MsgpackEventDecoder("sglang", signed_hashes=True).decode(payload)
    stored, removed = batch.events
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    assert stored.block_hashes == [2**64 - 2] and stored.parent_block_hash == 2**64 - 3
    assert stored.token_ids == list(range(32))
    assert stored.medium == "CPU_PINNED" and removed.medium == "EXTERNAL"
    assert removed.block_hashes == [2**64 - 2]
    assert batch.dp_rank == 2


def test_signed_hashes_on_the_fast_path_are_normalized() -> None:
    ev: dict[str, object] = {"type": "BlockStored", "block_hashes": [-1, 5], "parent_block_hash": None}
    ev |= {"token_ids": list(range(64)), "block_size": 32}
    batch = MsgpackEventDecoder("sglang", signed_hashes=True).decode(msgspec.msgpack.encode([0.0, [ev], 0]))
    stored = batch.events[0]
    assert isinstance(stored, BlockStored) and stored.block_hashes == [2**64 - 1, 5]


def test_unknown_event_types_are_skipped_and_counted() -> None:
    dec = MsgpackEventDecoder()
    batch = dec.decode(msgspec.msgpack.encode([0.0, [{"type": "SomethingNew", "x": 1}], 0]))
    assert batch.events == [] and dec.unknown_events == 1


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1garbage",
        msgspec.msgpack.encode({"not": "a batch"}),
        msgspec.msgpack.encode([0.0, [["BlockStored", 1]], 0]),
    ],
)
def test_garbage_raises_kv_decode_error(payload: bytes) -> None:
    with pytest.raises(KvDecodeError):
        MsgpackEventDecoder().decode(payload)


def test_plugins_register_vllm_and_sglang_decoders() -> None:
    from infera_core.plugin.hooks import InferaHooks

    decoders = InferaHooks.load().catalog().kv_decoders
    assert {"vllm", "sglang"} <= set(decoders.names())
    assert decoders.get("sglang").decode(msgspec.msgpack.encode([0.0, [], 0])).events == []

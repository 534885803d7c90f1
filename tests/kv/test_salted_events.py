"""KV-event fields that change what a block hash means: vLLM's ``extra_keys`` (cache salt, LoRA
name, multimodal items) and ``lora_name``, SGLang's ``cache_salt`` (``BlockStoredWithMetadata``).

A salted, LoRA or multimodal block gets its own chain in the index, so it is never credited to
a prompt with the same tokens and another salt (or none); prompts hashed from the same namespace
(:func:`~infera_core.kv.hashing.namespace_root`) find it. The vLLM frames are real (vLLM 0.32 on
CPU, ``record_salted_frames.py``); the SGLang ones are built in its three wire shapes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from kv_recorded import frames

from infera_core.kv.decode import MsgpackEventDecoder
from infera_core.kv.events import BlockStored, BlockStoredRaw, plain
from infera_core.kv.hashing import namespace_root
from infera_core.kv.index import KvIndex, WorkerView

BS = 32
SEQ = {r["seq"]: r["payload"] for r in frames("salted")}
# the recording's prompts (record_salted_frames.py): P three times (no salt, tenant-a, tenant-b),
# then SHARED (P's first two blocks, then other tokens) with tenant-a
P = [1] + [(i * 37) % 4000 + 10 for i in range(99)]
SHARED = P[:64] + [(i * 11) % 4000 + 10 for i in range(40)]
VLLM = MsgpackEventDecoder("vllm")
SGLANG = MsgpackEventDecoder("sglang", signed_hashes=True)


def _ingest(index: KvIndex, view: WorkerView, payload: bytes, decoder: MsgpackEventDecoder = VLLM) -> None:
    """As the event hub does: the native parser first, the Python decoder when it declines."""
    if index.apply_payload(view, payload) is None:
        index.apply(view, decoder.decode_raw(payload))


def _matched(
    index: KvIndex, view: WorkerView, tokens: list[int], salt: str | None = None, lora: str | None = None
) -> int:
    if salt is None and lora is None:
        hashes = index.hash_prompt(tokens, BS)
    else:
        hashes = index.hash_prompt(tokens, BS, namespace_root(lora, salt))
    return int(index.match(hashes, [view])[0])


def _index() -> tuple[KvIndex, WorkerView]:
    index = KvIndex()
    return index, index.add_view("w", None, BS)


def test_a_recorded_salted_vllm_block_is_decoded_with_its_salt() -> None:
    for decode in (VLLM.decode, VLLM.decode_raw):
        (ev,) = decode(SEQ[1]).events
        assert isinstance(ev, BlockStored | BlockStoredRaw) and ev.parent_block_hash is None
        assert ev.extra_keys == [["tenant-a"], None, None]
        assert not plain(ev)
    (unsalted,) = VLLM.decode(SEQ[0]).events
    assert isinstance(unsalted, BlockStored) and unsalted.extra_keys == [None, None, None] and plain(unsalted)


def test_a_salted_block_is_never_credited_to_an_unsalted_prompt(ingest: str) -> None:
    index, view = _index()
    _ingest(index, view, SEQ[1])  # only tenant-a's copy of P is cached
    assert view.block_count() == 3
    assert _matched(index, view, P) == 0, "tenant-a's cached P was credited to an unsalted prompt"
    assert _matched(index, view, P, salt="tenant-b") == 0
    assert _matched(index, view, P, salt="tenant-a") == 3


def test_each_salt_keeps_its_own_chain_and_its_hits(ingest: str) -> None:
    index, view = _index()
    for seq in sorted(SEQ):
        _ingest(index, view, SEQ[seq])
    assert view.unknown_parent == 0
    assert _matched(index, view, P) == 3
    assert _matched(index, view, P, salt="tenant-a") == 3
    assert _matched(index, view, P, salt="tenant-b") == 3
    # tenant-a's second prompt continued tenant-a's chain after P's two shared blocks
    assert _matched(index, view, SHARED, salt="tenant-a") == 3
    assert _matched(index, view, SHARED, salt="tenant-b") == 2
    assert _matched(index, view, SHARED) == 2


def test_the_native_parser_leaves_keyed_events_to_python(native: Any) -> None:
    index, view = _index()
    assert index.apply_payload(view, SEQ[0]) == 1  # plain blocks (extra_keys all null): native
    assert index.apply_payload(view, SEQ[1]) is None  # a salt: the Python path
    index.apply(view, VLLM.decode_raw(SEQ[1]))
    # a plain block chained on a salted one is native again: its parent carries the salt
    assert index.apply_payload(view, SEQ[3]) == 1
    assert _matched(index, view, SHARED, salt="tenant-a") == 3
    assert _matched(index, view, SHARED) == 2


def _batch(*events: Any) -> bytes:
    return msgspec.msgpack.encode([1.0, list(events), None])


TOKS = list(range(100, 100 + 2 * BS))
H = [2**40 + 1, 2**40 + 2]


@pytest.mark.parametrize(
    "event",
    [
        # SGLang before the positional tail: metadata appended as the 8th item
        ["BlockStored", H, None, TOKS, BS, None, "GPU", {"cache_salt": "tenant-a"}],
        # SGLang with vLLM's positional tail: the salt in extra_keys (Dynamo's prefix) and the map last
        ["BlockStored", H, None, TOKS, BS, None, "GPU", None, [["dynamo-cache-salt:tenant-a"]], None, None, None,
         None, None, {"cache_salt": "tenant-a"}],
        # map layout
        {"type": "BlockStored", "block_hashes": H, "parent_block_hash": None, "token_ids": TOKS,
         "block_size": BS, "lora_id": None, "medium": "GPU", "metadata": {"cache_salt": "tenant-a"}},
    ],
    ids=["array-metadata", "array-positional", "map-metadata"],
)  # fmt: skip
def test_sglang_salted_blocks_root_in_their_salt(ingest: str, event: Any) -> None:
    index, view = _index()
    _ingest(index, view, _batch(event), SGLANG)
    assert view.block_count() == 2
    assert _matched(index, view, TOKS) == 0
    assert _matched(index, view, TOKS, salt="tenant-a") == 2


def test_lora_blocks_root_in_the_adapter_name(ingest: str) -> None:
    """vLLM puts the adapter's name first in every block's extra keys (and the salt after it)."""
    ev: dict[str, Any] = {"type": "BlockStored", "block_hashes": H, "parent_block_hash": None, "token_ids": TOKS,
                          "block_size": BS, "lora_id": 1, "medium": "GPU", "lora_name": "sql-lora",
                          "extra_keys": [["sql-lora", "s1"], ["sql-lora"]]}  # fmt: skip
    index, view = _index()
    _ingest(index, view, _batch(ev))
    assert _matched(index, view, TOKS) == 0
    assert _matched(index, view, TOKS, lora="sql-lora") == 0  # another salt
    assert _matched(index, view, TOKS, lora="sql-lora", salt="s1") == 2
    ev.update(block_hashes=[2**41, 2**41 + 1], extra_keys=[["sql-lora"], ["sql-lora"]])
    _ingest(index, view, _batch(ev))
    assert _matched(index, view, TOKS, lora="sql-lora") == 2
    assert _matched(index, view, TOKS, lora="other-lora") == 0


def test_a_multimodal_block_is_not_credited_to_a_text_prompt(ingest: str) -> None:
    """``(mm hash, offset)`` in a block's keys: content the token ids do not show."""
    ev = {"type": "BlockStored", "block_hashes": H, "parent_block_hash": None, "token_ids": TOKS,
          "block_size": BS, "lora_id": None, "medium": "GPU", "lora_name": None,
          "extra_keys": [None, [["9f3ab0", 5]]]}  # fmt: skip
    index, view = _index()
    _ingest(index, view, _batch(ev))
    assert view.block_count() == 2
    assert _matched(index, view, TOKS) == 1  # the text block before the image is shared

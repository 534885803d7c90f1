"""LMCache's KV events as vLLM 0.32 publishes them, through the Python decoder and the native
parser: what the router can index and what it cannot (docs/explanation/kv-routing.md, "LMCache").

The frames are shaped as the two sources build them (checked against their code):

* LMCache ``LMCacheEngine.store`` (``lmcache/v1/cache_engine.py``, with ``enable_kv_events``)
  makes one ``CacheStoreEvent`` per LMCache chunk: ``block_hashes=[chunk_hash]`` (LMCache's own
  chunk hash), ``parent_block_hash`` None for the prompt's first chunk, else the previous chunk's
  hash *of the same call* (``prev_key`` starts at 0, so a call that skips leading tokens names
  parent 0), ``token_ids`` the chunk's tokens, ``block_size`` the chunk's token count
  (``chunk_size``, 256 by default; the last one shorter when partial chunks are saved),
  ``medium="cpu"``. It makes no removal events.
* vLLM's ``LMCacheConnectorV1.get_kv_connector_kv_cache_events`` turns each into a vLLM
  ``BlockStored`` with those fields, published on the worker's own KV event stream (msgpack
  map layout, trailing defaults omitted: the shape below is what vLLM 0.32's encoder writes).
  ``LMCacheMPConnector`` (``--kv-offloading-backend lmcache``) publishes none (``take_events``
  returns ``()``).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from kv_stores import snapshot

from infera_core.kv import accel
from infera_core.kv.decode import MsgpackEventDecoder
from infera_core.kv.index import TIER_CPU, TIER_GPU, KvIndex, WorkerView

BS = 16
NATIVE = accel.native_ops()
PROMPT = list(range(7000, 7000 + 512))


def lmcache_store(tokens: list[int], chunk: int, skip: int = 0, first_hash: int = 11) -> bytes:
    """One ``LMCacheEngine.store`` call as vLLM publishes it: chunks from ``skip`` on."""
    events: list[dict[str, Any]] = []
    prev = 0  # LMCache's prev_key, reset per store() call
    for start in range(skip, len(tokens), chunk):
        part = tokens[start : start + chunk]
        chunk_hash = first_hash + start  # LMCache's chunk hash: an int per chunk
        events.append(
            {
                "type": "BlockStored",
                "block_hashes": [chunk_hash],
                "parent_block_hash": None if start == 0 else prev,
                "token_ids": part,
                "block_size": len(part),
                "lora_id": None,
                "medium": "cpu",
                "lora_name": None,
            }
        )
        prev = chunk_hash
    return msgspec.msgpack.encode([1.0, events, None])


def _index(ingest: str, payloads: list[bytes], block_size: int = BS) -> tuple[KvIndex, WorkerView]:
    index = KvIndex()
    view = index.add_view("w", None, block_size)
    for seq, payload in enumerate(payloads):
        if ingest == "native":
            assert index.apply_payload(view, payload, seq) is not None
        else:
            index.apply(view, MsgpackEventDecoder().decode_raw(payload), seq)
    return index, view


def _score(index: KvIndex, view: WorkerView, tokens: list[int]) -> float:
    return float(index.match(index.hash_prompt(tokens, view.block_size), [view], (1.0, 0.5, 0.25))[0])


def test_chunks_of_the_workers_block_size_are_credited_on_the_cpu_tier(ingest: str) -> None:
    """LMCache ``chunk_size`` = the worker's block size: each chunk is one block, chained."""
    tokens = PROMPT[: 4 * BS]
    index, view = _index(ingest, [lmcache_store(tokens, BS)])
    assert (len(view.held(TIER_GPU)), len(view.held(TIER_CPU))) == (0, 4)
    assert _score(index, view, tokens) == 4 * 0.5
    assert view.bad_block_size == view.unknown_parent == 0


def test_default_256_token_chunks_are_not_indexed_and_are_counted(ingest: str) -> None:
    """LMCache's default chunk (256 tokens) on a 16-token-block worker: one hash for 16 router
    blocks; counted as a block size mismatch (logged once), never credited."""
    index, view = _index(ingest, [lmcache_store(PROMPT, 256)])
    assert view.block_count() == 0 and view.bad_block_size == 2
    assert _score(index, view, PROMPT) == 0


def test_a_store_that_skips_leading_tokens_names_parent_0_and_is_not_indexed(ingest: str) -> None:
    """A second ``store`` for the same prompt (chunked prefill, or a prefix LMCache already had)
    starts mid-prompt: its first chunk's parent is LMCache's initial ``prev_key`` 0, which no
    event ever stored, so the chain (and every chunk after it) cannot be placed."""
    tokens = PROMPT[: 4 * BS]
    index, view = _index(
        ingest, [lmcache_store(tokens[: 2 * BS], BS), lmcache_store(tokens, BS, skip=2 * BS)]
    )
    assert len(view.held(TIER_CPU)) == 2 and view.unknown_parent == 2
    assert _score(index, view, tokens) == 2 * 0.5


def test_a_partial_last_chunk_is_a_block_size_mismatch(ingest: str) -> None:
    tokens = PROMPT[: 2 * BS + 5]
    _, view = _index(ingest, [lmcache_store(tokens, BS)])
    assert len(view.held(TIER_CPU)) == 2 and view.bad_block_size == 1


@pytest.mark.skipif(NATIVE is None, reason="infera-kv-native is not built")
def test_both_paths_build_the_same_index_from_lmcache_streams() -> None:
    stream = [
        lmcache_store(PROMPT[:96], BS),
        lmcache_store(PROMPT, 256),
        lmcache_store(PROMPT[:80], BS, skip=48),
    ]
    built = []
    for path in ("python", "native"):
        before = accel.ops
        accel.ops = NATIVE if path == "native" else accel.PYTHON  # type: ignore[assignment]
        try:
            index, view = _index(path, stream)
            built.append((snapshot(index.blocks, [view.slot]), view.bad_block_size, view.unknown_parent))
        finally:
            accel.ops = before
    assert built[0] == built[1]

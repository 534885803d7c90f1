"""Every ``medium`` name the engines really emit lands on its tier, in the Python path (decoder +
``KvIndex.apply``) and in the native batch parser (``KvIndex.apply_payload``, what the hub runs)
alike, and the router credits it with that tier's weight.

Frames are shaped as each engine's publisher sends them (msgpack ``[ts, events, dp_rank]``):

* SGLang HiCache (``python/sglang/srt/mem_cache/hiradix_cache.py``, ``StorageMedium`` in
  ``disaggregation/kv_events.py`` since sgl-project/sglang#22894): a page goes ``BlockStored
  GPU`` on insert, ``BlockStored CPU_PINNED`` when its write-through to the host pool is acked
  (same page hash: the hash does not depend on the medium), ``BlockRemoved GPU`` when the device
  copy is evicted; storage backends ``DISK``/``EXTERNAL``. The releases with sgl-project/sglang#18205
  but before #22894 spelled the host tier ``CPU_TIER1`` and storage ``CPU_TIER2``. Signed int64 hashes.
* vLLM 0.32: ``GPU`` block pool, ``CPU``/``STORAGE`` from its offloading connector.
* LMCache through vLLM's ``LMCacheConnectorV1``: ``"cpu"`` (lower case).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from kv_stores import snapshot

from infera_core.kv import accel
from infera_core.kv.decode import MsgpackEventDecoder
from infera_core.kv.index import TIER_CPU, TIER_DISK, TIER_GPU, KvIndex, WorkerView, medium_tier

BS = 16
PAGES = 6
TOKENS = list(range(500, 500 + PAGES * BS))
WEIGHTS = (1.0, 0.5, 0.25)
NATIVE = accel.native_ops()

ENGINE_MEDIA = {
    "GPU": TIER_GPU,
    "CPU_PINNED": TIER_CPU,  # SGLang HiCache L2
    "CPU_TIER1": TIER_CPU,  # SGLang between #18205 and #22894
    "CPU": TIER_CPU,  # vLLM offloading, ATOM
    "cpu": TIER_CPU,  # LMCache
    "DISK": TIER_DISK,  # SGLang L3, ATOM
    "EXTERNAL": TIER_DISK,  # SGLang shared pool (Mooncake)
    "CPU_TIER2": TIER_DISK,  # SGLang between #18205 and #22894
    "STORAGE": TIER_DISK,  # vLLM offloading storage
    "REMOTE": TIER_DISK,  # ATOM: blocks a PD decode received
}


def _apply(index: KvIndex, view: WorkerView, payload: bytes, seq: int, how: str) -> None:
    if how == "native":
        assert index.apply_payload(view, payload, seq) is not None, "the native parser handed it back"
    else:
        index.apply(view, MsgpackEventDecoder("sglang", signed_hashes=True).decode_raw(payload), seq)


def _signed(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


def _pages(first: int, last: int) -> tuple[list[int], int | None, list[int]]:
    """SGLang-style page hashes (signed int64) of pages first..last-1, their parent, their tokens."""
    hashes = [_signed((0x9E3779B97F4A7C15 * (i + 1)) & ((1 << 64) - 1)) for i in range(PAGES)]
    parent = hashes[first - 1] if first else None
    return hashes[first:last], parent, TOKENS[first * BS : last * BS]


def _stored(first: int, last: int, medium: str) -> dict[str, Any]:
    hashes, parent, tokens = _pages(first, last)
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": BS,
        "lora_id": None,
        "medium": medium,
    }


def _removed(first: int, last: int, medium: str) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": _pages(first, last)[0], "medium": medium}


def _batch(*events: dict[str, Any]) -> bytes:
    return msgspec.msgpack.encode([1.0, list(events), None])


def _score(index: KvIndex, view: WorkerView, weights: tuple[float, float, float] = WEIGHTS) -> float:
    return float(index.match(index.hash_prompt(TOKENS, BS), [view], weights)[0])


@pytest.mark.parametrize(("medium", "tier"), sorted(ENGINE_MEDIA.items()))
def test_every_engine_medium_lands_on_its_tier(ingest: str, medium: str, tier: int) -> None:
    assert medium_tier(medium) == tier
    index = KvIndex()
    view = index.add_view("w", None, BS)
    _apply(index, view, _batch(_stored(0, PAGES, medium)), 0, ingest)
    assert [len(view.held(t)) for t in (TIER_GPU, TIER_CPU, TIER_DISK)] == [
        PAGES if t == tier else 0 for t in (TIER_GPU, TIER_CPU, TIER_DISK)
    ]
    assert _score(index, view) == PAGES * WEIGHTS[tier]
    _apply(index, view, _batch(_removed(0, PAGES, medium)), 1, ingest)
    assert view.block_count() == 0 and view.unknown_removed == 0, "removed from the tier it was stored on"


@pytest.mark.parametrize("host", ["CPU_PINNED", "CPU_TIER1"])
def test_sglang_hicache_pages_written_to_host_then_evicted_from_gpu_keep_host_credit(
    ingest: str, host: str
) -> None:
    """Insert 6 pages (GPU), write 6 through to the host pool, evict the last 4 device copies:
    the prompt scores 2 GPU pages + 4 host pages at the CPU weight (4 at the disk weight before
    the host tier's names were mapped)."""
    index = KvIndex()
    view = index.add_view("w", None, BS)
    _apply(index, view, _batch(_stored(0, PAGES, "GPU")), 0, ingest)
    _apply(index, view, _batch(_stored(0, 3, host), _stored(3, PAGES, host)), 1, ingest)
    _apply(index, view, _batch(_removed(2, PAGES, "GPU")), 2, ingest)
    assert (len(view.held(TIER_GPU)), len(view.held(TIER_CPU)), len(view.held(TIER_DISK))) == (2, PAGES, 0)
    assert _score(index, view) == 2 * 1.0 + 4 * 0.5
    assert _score(index, view, (1.0, 0.0, 0.0)) == 2, "no CPU credit: only the GPU pages count"
    _apply(index, view, _batch(_stored(0, PAGES, "EXTERNAL"), _removed(0, PAGES, host)), 3, ingest)
    assert _score(index, view) == 2 * 1.0 + 4 * 0.25, "backed up to storage, gone from the host pool"


@pytest.mark.skipif(NATIVE is None, reason="infera-kv-native is not built")
def test_native_and_python_paths_build_the_same_tiers_from_every_name() -> None:
    """One stream mixing every engine's names (and their lower-case spellings): same store."""
    stream = []
    for seq, (medium, _) in enumerate(sorted(ENGINE_MEDIA.items())):
        spelled = medium.lower() if seq % 2 else medium
        stream.append(_batch(_stored(0, 4, spelled), _removed(seq % 4, 4, spelled), _stored(0, 2, spelled)))
    built = []
    for how in ("python", "native"):
        before = accel.ops
        accel.ops = NATIVE if how == "native" else accel.PYTHON  # type: ignore[assignment]
        try:
            index = KvIndex()
            view = index.add_view("w", None, BS)
            for seq, payload in enumerate(stream):
                _apply(index, view, payload, seq, how)
            built.append((snapshot(index.blocks, [view.slot]), view.unknown_removed, view.events_applied))
        finally:
            accel.ops = before
    assert built[0] == built[1]
    assert all(built[0][0]["slots"][0][1][t] for t in (TIER_GPU, TIER_CPU, TIER_DISK))

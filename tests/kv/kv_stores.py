"""Comparable snapshots of a block store, whichever implementation holds it."""

from __future__ import annotations

from typing import Any

import infera_kv_native

from infera_core.kv.store import TIERS, BlockStore, PyBlockStore


def dumps(store: BlockStore, slot: int) -> list[tuple[list[tuple[int, int]], dict[int, int]]]:
    """Per tier: (engine key → router hash, oldest first; duplicate counts). Engine hashes
    are shown as the native store files them (ints as u64 bits, bytes folded)."""
    out = []
    for tier in TIERS:
        items, dups = store.dump(slot, tier)
        if isinstance(store, PyBlockStore):
            items = [(infera_kv_native.fold_key(k), rh) for k, rh in items]
        out.append(([(int(k), rh) for k, rh in items], dups))
    return out


def snapshot(store: BlockStore, slots: list[int]) -> dict[str, Any]:
    return {
        "masks": [store.masks(t) for t in TIERS],
        "slots": {s: (dumps(store, s), store.nblocks(s), [store.held(s, t) for t in TIERS]) for s in slots},
        "unique": store.unique_hashes(),
    }

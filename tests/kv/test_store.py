"""The native block store (infera-kv-native's C tables) behaves exactly like the pure-Python
specification, PyBlockStore: random operation sequences, compared step by step."""

from __future__ import annotations

import random

import pytest
from kv_stores import snapshot

from infera_core.kv import accel
from infera_core.kv.events import BlockHash
from infera_core.kv.store import BlockStore, PyBlockStore

NATIVE = accel.native_ops()
SLOTS = [0, 1, 2, 63, 64, 65, 130]  # three 64-slot chunks


def native_store() -> BlockStore:
    assert NATIVE is not None, "infera-kv-native is not built (it needs a C compiler when installed)"
    return NATIVE.new_store()


def _key(rng: random.Random) -> BlockHash:
    r = rng.random()
    if r < 0.7:
        return rng.randrange(60)
    if r < 0.8:
        return rng.choice([-1, -(2**63), 2**64 - 2, 2**63 + 1])  # no int with its u64 twin
    return bytes([rng.randrange(6)]) * rng.choice([1, 8, 32])


def _step(rng: random.Random, store: BlockStore) -> object:
    slot = rng.choice(SLOTS)
    tier = rng.choice([0, 0, 1, 2])
    n = rng.randrange(1, 7)
    keys = [_key(rng) for _ in range(n)]
    r = rng.random()
    if r < 0.45:  # router hashes from a small space, so duplicates across engine hashes occur
        return store.store(
            slot, tier, keys, [rng.randrange(-20, 20) * 2**40 for _ in range(rng.randrange(n + 1))]
        )
    if r < 0.8:
        return store.remove(slot, tier, keys)
    if r < 0.85:
        return store.evict_oldest(slot, rng.randrange(6))
    if r < 0.88:
        store.clear(slot)
        return None
    if r < 0.94:
        return store.lookup(slot, keys[0])
    hashes = [rng.randrange(-20, 20) * 2**40 for _ in range(rng.randrange(8))]
    slots = [rng.choice([*SLOTS, -1]) for _ in range(rng.randrange(1, 6))]
    return store.match(hashes, slots, rng.choice([(1.0, 0.5, 0.25), (1.0, 1.0, 1.0), (2.0, 0.3, 0.0)]))


@pytest.mark.parametrize("seed", range(12))
def test_random_operations_give_identical_results_and_tables(seed: int) -> None:
    py, nat = PyBlockStore(), native_store()
    rng_py, rng_nat = random.Random(seed), random.Random(seed)
    dups_seen = lower_tier_credit = False
    for i in range(600):
        got_py, got_nat = _step(rng_py, py), _step(rng_nat, nat)
        assert got_py == got_nat, f"step {i}"
        if isinstance(got_py, list) and any(x % 1 for x in got_py):
            lower_tier_credit = True
        if i % 50 == 49:
            assert snapshot(py, SLOTS) == snapshot(nat, SLOTS), f"after step {i}"
            dups_seen |= any(d for s in SLOTS for _, d in snapshot(py, [s])["slots"][s][0])
    assert snapshot(py, SLOTS) == snapshot(nat, SLOTS)
    assert dups_seen and lower_tier_credit  # the rare paths were exercised


def test_eviction_takes_the_oldest_blocks_and_lower_tiers_first() -> None:
    for store in (PyBlockStore(), native_store()):
        store.store(0, 0, [1, 2, 3], [11, 12, 13])
        store.store(0, 1, [4, 5], [14, 15])
        store.remove(0, 0, [1])
        store.store(0, 0, [1], [11])  # re-stored: now the newest GPU block
        assert store.evict_oldest(0, 3) == 3
        assert store.nblocks(0) == (2, 0, 0)
        assert store.held(0, 0) == {13, 11}


def test_tables_grow_compact_and_report_their_memory() -> None:
    store = native_store()
    keys: list[BlockHash] = list(range(100_000))
    assert store.store(5, 0, keys, [int(k) * 7919 for k in keys]) == 100_000
    big = store.memory_bytes()
    for _ in range(3):  # churn: removed entries are compacted away, not accumulated
        assert store.remove(5, 0, keys[:50_000]) == (50_000, 0)
        assert store.store(5, 0, keys[:50_000], [int(k) * 7919 for k in keys[:50_000]]) == 50_000
    assert store.memory_bytes() <= 2 * big
    assert store.match([int(k) * 7919 for k in keys[50_000:50_010]], [5], (1.0, 0.5, 0.25)) == [10.0]
    store.clear(5)
    assert store.nblocks(5) == (0, 0, 0) and store.unique_hashes() == 0
    assert store.memory_bytes() < big // 100


@pytest.mark.parametrize("seed", range(4))
def test_blocks_all_candidates_hold_are_matched_like_the_rest(seed: int) -> None:
    """The native walk checks a block every candidate holds on the GPU once (the holders' key):
    same answers as the specification with shared prefixes, holes, lower tiers and subsets."""
    rng = random.Random(seed)
    slots = list(range(150))
    shared = [(k + 1) * 2**40 for k in range(24)]
    py, nat = PyBlockStore(), native_store()
    for store in (py, nat):
        for s in slots:
            store.store(s, 0, [f"e{s}-{k}".encode() for k in range(24)], shared)
            store.store(s, 0, [f"o{s}".encode()], [(s + 100) * 2**40])
    for _ in range(30):  # holes: some slots lose a shared block, or keep it on CPU only
        s, k, cpu = rng.choice(slots), rng.randrange(24), rng.random() < 0.5
        for store in (py, nat):
            store.remove(s, 0, [f"e{s}-{k}".encode()])
            if cpu:
                store.store(s, 1, [f"c{s}-{k}".encode()], [shared[k]])
    for _ in range(40):
        cands = rng.sample(slots, rng.choice([1, 2, 64, 150])) + rng.choice([[], [-1]])
        prompt = [*shared[: rng.randrange(25)], rng.choice([1000, cands[0] + 100]) * 2**40]
        w = rng.choice([(1.0, 0.5, 0.25), (1.0, 1.0, 1.0)])
        assert py.match(prompt, cands, w) == nat.match(prompt, cands, w)

"""The KV index: built from real recorded vLLM frames, and its prefix match."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kv_recorded import frames

from infera_core.kv import accel
from infera_core.kv.decode import MsgpackEventDecoder
from infera_core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventBatch
from infera_core.kv.index import KvIndex

BS = 32


@pytest.fixture(autouse=True, params=["native", "python"])
def hot_loops(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test runs on the C extension's hot loops and on the pure-Python ones."""
    before = accel.ops
    ops = accel.use_native(request.param == "native")
    assert ops.name == request.param, "infera-kv-native is not built (needs a C compiler at install)"
    yield ops.name
    accel.ops = before


def _replay(name: str) -> tuple[KvIndex, list[KvEventBatch]]:
    dec = MsgpackEventDecoder()
    index = KvIndex()
    view = index.add_view("w", None, BS)
    batches = []
    for rec in frames(name):
        index.apply(view, dec.decode_raw(rec["payload"]), rec["seq"])  # as the event hub does
        batches.append(dec.decode(rec["payload"]))
    return index, batches


def test_prefix_shared_between_recorded_prompts() -> None:
    index, batches = _replay("prefix-sharing")
    view = index.views()[0]
    first = batches[0].events[0]
    second = batches[1].events[0]
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    # the second prompt's new blocks hang off block 4 of the first prompt
    shared = first.block_hashes.index(second.parent_block_hash)  # type: ignore[arg-type]
    prompt_b = first.token_ids[: (shared + 1) * BS] + second.token_ids
    assert index.match(index.hash_prompt(first.token_ids, BS), [view]) == [len(first.block_hashes)]
    assert index.match(index.hash_prompt(prompt_b, BS), [view]) == [shared + 1 + len(second.block_hashes)]
    # a prompt that diverges inside block 2 matches exactly two blocks
    diverged = first.token_ids[: 2 * BS] + [7] * (4 * BS)
    assert index.match(index.hash_prompt(diverged, BS), [view]) == [2]
    assert view.unknown_parent == 0
    assert view.last_seq == len(batches) - 1
    stored = {h for b in batches for e in b.events if isinstance(e, BlockStored) for h in e.block_hashes}
    assert view.block_count() == len(stored)


def test_evictions_and_clear_follow_the_recorded_run() -> None:
    dec = MsgpackEventDecoder()
    index = KvIndex()
    view = index.add_view("w", None, BS)
    present: dict[int | bytes, list[int]] = {}  # engine hash -> tokens of the prefix ending there
    saw_removal = saw_clear = False
    for rec in frames("evict-and-clear"):
        batch = dec.decode(rec["payload"])
        index.apply(view, dec.decode_raw(rec["payload"]), rec["seq"])
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                prefix = present.get(ev.parent_block_hash, []) if ev.parent_block_hash is not None else []
                for i, h in enumerate(ev.block_hashes):
                    present[h] = prefix + ev.token_ids[: (i + 1) * BS]
            elif isinstance(ev, BlockRemoved):
                saw_removal = True
                for h in ev.block_hashes:
                    removed_tokens = present.pop(h)
                    # an evicted block is no longer credited: the match stops before it
                    depth = len(removed_tokens) // BS
                    got = index.match(index.hash_prompt(removed_tokens, BS), [view])[0]
                    assert got < depth
            elif isinstance(ev, AllBlocksCleared):
                saw_clear = True
                present.clear()
        assert view.block_count() == len(present)
        for tokens in present.values():
            assert index.match(index.hash_prompt(tokens, BS), [view])[0] == len(tokens) // BS
    assert saw_removal and saw_clear
    assert view.unknown_removed == 0 and view.unknown_parent == 0


def _store(index: KvIndex, view_key: tuple[str, int | None], tokens: list[int], **kw: object) -> None:
    view = index.view(*view_key)
    assert view is not None
    n = len(tokens) // BS
    base = hash(tuple(tokens)) & 0xFFFFFFFF
    ev = BlockStored([base * 1000 + i for i in range(n)], None, tokens, BS, **kw)  # type: ignore[arg-type]
    index.apply(view, KvEventBatch(0.0, [ev]))


def test_one_pass_match_agrees_with_naive_walk_across_workers() -> None:
    index = KvIndex()
    prompt = list(range(1000, 1000 + 10 * BS))
    views = [index.add_view(f"w{i}", None, BS) for i in range(5)]
    for i, v in enumerate(views):
        if i:
            _store(index, v.key, prompt[: i * 2 * BS])
    hashes = index.hash_prompt(prompt, BS)
    assert index.match(hashes, views) == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert index.naive_match(hashes, [v.held() for v in views]) == [0, 2, 4, 6, 8]
    assert index.match(hashes, [None, views[4]]) == [0.0, 8.0]


def test_lora_adapters_are_kept_apart_and_tiers_weighted() -> None:
    index = KvIndex()
    a = index.add_view("a", None, BS)
    b = index.add_view("b", None, BS)
    prompt = list(range(4 * BS))
    _store(index, a.key, prompt, lora_id=7)
    _store(index, b.key, prompt, medium="CPU")
    hashes = index.hash_prompt(prompt, BS)
    assert index.match(hashes, [a, b], tier_weights=(1.0, 0.5, 0.25)) == [0.0, 2.0]


def test_non_attention_groups_are_not_indexed() -> None:
    index = KvIndex()
    v = index.add_view("w", None, BS)
    _store(index, v.key, list(range(2 * BS)), kv_cache_spec_kind="mamba", group_idx=1)
    assert v.block_count() == 0
    _store(index, v.key, list(range(2 * BS)), kv_cache_spec_kind="mla_attention", group_idx=0)
    assert v.block_count() == 2


def test_unknown_parent_is_counted_not_guessed() -> None:
    index = KvIndex()
    v = index.add_view("w", None, BS)
    index.apply(v, KvEventBatch(0.0, [BlockStored([5], 999, list(range(BS)), BS)]))
    assert v.unknown_parent == 1 and v.block_count() == 0


def test_dropping_a_worker_frees_its_blocks_and_slot() -> None:
    index = KvIndex()
    prompt = list(range(3 * BS))
    a = index.add_view("a", None, BS)
    b = index.add_view("b", 1, BS)
    _store(index, a.key, prompt)
    _store(index, b.key, prompt)
    assert index.drop_worker("a") == 1
    hashes = index.hash_prompt(prompt, BS)
    assert index.match(hashes, [b]) == [3.0]
    c = index.add_view("c", None, BS)
    assert c.slot == a.slot and index.match(hashes, [c]) == [0.0]


def test_memory_bound_evicts_oldest_entries_of_largest_view() -> None:
    index = KvIndex(max_blocks=100)
    v = index.add_view("w", None, BS)
    for i in range(80):
        _store(index, v.key, [i * 100 + t for t in range(2 * BS)])
    assert index.block_count() <= 100
    assert v.blocks_evicted >= 60 and index.stats()["evicted_for_memory"] == v.blocks_evicted
    newest = [79 * 100 + t for t in range(2 * BS)]
    assert index.match(index.hash_prompt(newest, BS), [v]) == [2.0]
    oldest = list(range(2 * BS))
    assert index.match(index.hash_prompt(oldest, BS), [v]) == [0.0]


def test_events_with_another_block_size_than_the_record_are_counted_not_indexed() -> None:
    index = KvIndex()
    v = index.add_view("w", None, BS)
    index.apply(v, KvEventBatch(0.0, [BlockStored([1, 2], None, list(range(32)), 16)]))
    assert v.block_count() == 0 and v.summary()["block_size_mismatches"] == 1


def test_two_engine_hashes_for_the_same_tokens_keep_the_block_until_both_go() -> None:
    index = KvIndex()
    v = index.add_view("w", None, BS)
    other = index.add_view("x", None, BS)
    toks = list(range(2 * BS))
    hashes = index.hash_prompt(toks, BS)
    # e.g. the same text under two cache_salt values: distinct engine hashes, same tokens
    index.apply(
        v, KvEventBatch(0.0, [BlockStored([1, 2], None, toks, BS), BlockStored([7, 8], None, toks, BS)])
    )
    index.apply(other, KvEventBatch(0.0, [BlockStored([1, 2], None, toks, BS)]))
    assert v.block_count() == 2 and index.match(hashes, [v, other]) == [2.0, 2.0]
    index.apply(v, KvEventBatch(0.0, [BlockRemoved([1, 2]), BlockStored([1, 2], None, toks, BS)]))
    index.apply(v, KvEventBatch(0.0, [BlockRemoved([2])]))
    assert index.match(hashes, [v, other]) == [2.0, 2.0]  # [7, 8] still hold both blocks
    index.apply(v, KvEventBatch(0.0, [BlockRemoved([8])]))
    assert index.match(hashes, [v, other]) == [1.0, 2.0] and v.block_count() == 1
    index.apply(v, KvEventBatch(0.0, [BlockRemoved([1, 7]), BlockRemoved([99])]))
    assert index.match(hashes, [v, other]) == [0.0, 2.0] and v.block_count() == 0
    assert v.unknown_removed == 1
    index.apply(
        v, KvEventBatch(0.0, [BlockStored([1, 2], None, toks, BS), BlockStored([1, 2], None, toks, BS)])
    )
    index.apply(v, KvEventBatch(0.0, [BlockRemoved([1, 2])]))  # a repeated store is not a second copy
    assert v.block_count() == 0 and index.match(hashes, [v, other]) == [0.0, 2.0]

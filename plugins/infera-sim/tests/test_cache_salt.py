"""The sim takes vLLM's ``cache_salt``: validated as vLLM validates it, folded into the first
block's hash (a salted prompt never hits an unsalted or other-salt prefix), and published in
the first block's ``extra_keys`` as vLLM 0.32 does, so the router can root the chain in it."""

from __future__ import annotations

import httpx
from infera_sim.kvcache import KvCache, block_hashes, salt_root
from infera_sim.testing import start_sim

from infera_core.kv.events import BlockStored

BS = 16
TOKENS = list(range(100, 100 + 3 * BS))


def test_a_salted_run_publishes_its_salt_in_the_first_blocks_extra_keys() -> None:
    cache = KvCache(8, BS)
    hashes = block_hashes(TOKENS, BS, parent=salt_root("tenant-a"))
    assert hashes != block_hashes(TOKENS, BS) and hashes != block_hashes(TOKENS, BS, parent=salt_root("b"))
    cache.commit(cache.allocate(3), 0, hashes, None, TOKENS, "tenant-a")
    (stored,) = cache.events
    assert isinstance(stored, BlockStored) and stored.parent_block_hash is None
    assert stored.extra_keys == [["tenant-a"], None, None]


def test_cache_salt_is_validated_and_keeps_prefixes_apart() -> None:
    prompt = " ".join(f"w{i}" for i in range(200))
    with start_sim(speedup="inf", block_size=BS, kv_events_port=None, kv_replay_port=None) as sim:

        def cached(**extra: object) -> int:
            body = {"prompt": prompt, "max_tokens": 1, **extra}
            r = httpx.post(sim.url + "/v1/completions", json=body, timeout=10)
            assert r.status_code == 200, r.text
            return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

        assert cached() == 0
        assert cached() > 0
        assert cached(cache_salt="tenant-a") == 0  # not the unsalted prefix
        assert cached(cache_salt="tenant-a") > 0
        assert cached(cache_salt="tenant-b") == 0
        for bad in ("", 7, "a/b"):
            r = httpx.post(sim.url + "/v1/completions", json={"prompt": "hi", "cache_salt": bad}, timeout=10)
            assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"

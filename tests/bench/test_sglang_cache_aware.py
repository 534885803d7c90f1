"""bench/fleet/sglang_cache_aware.py behaves as sgl-router's cache_aware policy does."""

from __future__ import annotations

from bench.fleet.sglang_cache_aware import CacheAware

W = ["w0", "w1", "w2"]


def test_a_matching_prompt_follows_its_prefix_and_a_new_one_goes_to_the_smallest_tree() -> None:
    ca = CacheAware(W)
    doc = list(range(100))
    first = ca.pick([*doc, 1000], W, [0, 0, 0], 0.0)
    assert ca.pick([*doc, 2000, 2001], W, [0, 0, 0], 1.0) == first  # 100/102 matched > 0.3
    other = ca.pick(list(range(500, 520)), W, [0, 0, 0], 2.0)  # no match: the smallest tree
    assert other != first
    third = ca.pick(list(range(900, 905)), W, [0, 0, 0], 3.0)
    assert third not in (first, other)
    # a short common part (under cache_threshold of the prompt) does not attract
    assert ca.pick(doc[:10] + list(range(3000, 3100)), W, [0, 0, 0], 4.0) == third


def test_imbalance_sends_to_the_least_loaded_and_still_records_the_prefix() -> None:
    ca = CacheAware(W, balance_abs_threshold=4, balance_rel_threshold=1.5)
    doc = list(range(50))
    home = ca.pick(doc, W, [0, 0, 0], 0.0)
    loads = [10, 10, 10]
    loads[(home + 1) % 3] = 1
    assert ca.pick(doc, W, loads, 1.0) == (home + 1) % 3
    assert ca.balanced_picks == 1
    # within the thresholds the prefix decides again (either holder)
    assert ca.pick(doc, W, [3, 3, 3], 2.0) in (home, (home + 1) % 3)


def test_eviction_trims_each_tenant_to_max_tree_size_oldest_leaves_first() -> None:
    ca = CacheAware(W, eviction_interval_s=10.0, max_tree_size=60)
    for t, base in enumerate((0, 1000, 2000)):
        ca.tree.insert(list(range(base, base + 40)), "w0", float(t))
    assert ca.tree.size["w0"] == 120
    ca.pick([5000], W, [0, 0, 0], 11.0)  # the eviction falls due
    assert ca.tree.size["w0"] <= 60
    matched, tenant = ca.tree.prefix_match(list(range(2000, 2040)), 12.0)
    assert (matched, tenant) == (40, "w0")  # the newest survived
    assert ca.tree.prefix_match(list(range(0, 40)), 12.0)[0] == 0  # the oldest went

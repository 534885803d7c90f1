"""infera_core.scheduling.tierguard: lower tiers keep to a share of the workers while a higher
tier is active, and get the whole fleet back once it is not."""

from __future__ import annotations

from infera_core.scheduling.tierguard import TierGuard

WORKERS = ["w0", "w1", "w2", "w3"]


def test_a_lower_tier_keeps_to_its_share_and_off_a_higher_tiers_workers_while_it_is_active() -> None:
    g = TierGuard(window=1.0, share=0.5)
    for w, n in (("w0", 3), ("w1", 2), ("w2", 1)):
        for _ in range(n):
            g.started(w, -1, 0.0)
    assert g.avoid(-1, WORKERS, 0.5) == set()  # no higher tier seen: the whole fleet
    g.started("w3", 1, 1.0)
    assert g.avoid(1, WORKERS, 1.0) == {"w0", "w1", "w2"}  # the critical one prefers w3
    assert g.avoid(-1, WORKERS, 1.5) == {"w2", "w3"}  # the two busiest hosts; w2 drains
    assert g.avoid(-1, WORKERS, 2.1) == set()  # the window passed: the whole fleet again
    g.ended("w3", 1)
    assert g.running.get("w3") is None


def test_a_higher_tier_is_never_kept_off_every_worker() -> None:
    g = TierGuard(window=1.0, share=0.5)
    for w in WORKERS:
        g.started(w, -1, 0.0)
    assert g.avoid(1, WORKERS, 0.0) == set()
    assert TierGuard(window=0.0).avoid(-1, WORKERS, 0.0) == set()  # off

"""The fair queue's order: tiers first, then start-time fair queuing between keys."""

from __future__ import annotations

import pytest

from infera_core.scheduling.fairqueue import FairQueue, Shares, Waiter, request_cost, tier_of


def w(key: str, cost: float = 10.0, tier: int = 0, weight: float = 1.0, t: float = 0.0) -> Waiter:
    return Waiter(key, tier, cost, t, None, weight)


def drain(q: FairQueue) -> list[str]:
    out = []
    while len(q):
        x = q.pop(0.0)
        assert x is not None
        out.append(x.key)
    return out


def behind_a_flood(capacity: int, flood: int) -> tuple[FairQueue, Waiter]:
    """A queue of ``capacity`` holding ``flood`` waiters of key A, then one of key B (returned)."""
    q = FairQueue(capacity)
    for _ in range(flood):
        q.push(w("A"))
    b = w("B")
    q.push(b)
    return q, b


def test_tiers_parse_by_name_and_number() -> None:
    assert [tier_of(x) for x in ("critical", "standard", "Sheddable", 5, "-3")] == [1, 0, -1, 5, -3]
    with pytest.raises(ValueError, match="critical"):
        tier_of("urgent")
    with pytest.raises(ValueError):
        tier_of(True)


def test_a_flood_does_not_delay_a_light_key() -> None:
    q, b = behind_a_flood(100, 20)
    assert q.ahead(b) <= 1  # served next or after the one A request already at the head
    assert drain(q)[:2].count("B") == 1


def test_equal_weights_alternate_and_weights_split_two_to_one() -> None:
    q = FairQueue(100)
    for _ in range(10):
        q.push(w("A"))
        q.push(w("B"))
    order = drain(q)
    assert order[:10].count("A") == 5
    q = FairQueue(100)
    for _ in range(30):
        q.push(w("A", weight=2.0))
        q.push(w("B", weight=1.0))
    first = drain(q)[:30]
    assert first.count("A") == 20 and first.count("B") == 10


def test_cost_counts_uncached_prompt_and_capped_output() -> None:
    assert request_cost(1000, 900, 50, 1024) == 150.0
    assert request_cost(10, 0, 10**9, 256) == 266.0
    q = FairQueue(100)
    for _ in range(4):
        q.push(w("big", cost=100.0))
    for _ in range(8):
        q.push(w("small", cost=10.0))
    assert drain(q)[:9].count("small") == 8  # a small request costs less of the share


def test_a_higher_tier_goes_first_and_evicts_the_newest_sheddable_when_full() -> None:
    q = FairQueue(3)
    s1, s2, std = w("s", tier=-1), w("s", tier=-1), w("x", tier=0)
    for x in (s1, s2, std):
        q.push(x)
    crit = w("c", tier=1)
    victim = q.victim(crit.tier, crit.key)
    assert victim == (s2, "priority")
    q.remove(s2)
    q.push(crit)
    assert drain(q) == ["c", "x", "s"]
    # a sheddable arrival into a full queue evicts nobody
    q = FairQueue(1)
    q.push(w("s", tier=-1))
    assert q.victim(-1, "t") is None


def test_a_full_queue_makes_the_flood_give_way_not_the_light_key() -> None:
    q = FairQueue(4)
    flood = [w("A") for _ in range(4)]
    for x in flood:
        q.push(x)
    assert q.victim(0, "B") == (flood[-1], "fair_share")
    assert q.victim(0, "A") is None  # the flood's own arrival is the one refused


def test_wait_estimate_follows_the_dispatch_rate() -> None:
    q = FairQueue(100)
    for _ in range(5):
        q.push(w("A"))
    assert q.estimated_wait(w("A")) is None
    for t in (1.0, 1.5, 2.0):
        q.pop(t)
    assert q.interval == pytest.approx(0.5)
    late = w("B")
    q.push(late)
    assert q.estimated_wait(late) == pytest.approx(0.5 * (q.ahead(late) + 1))
    q.remove(late)
    assert late not in list(q)


def test_shares_tell_a_key_over_its_fair_share_of_the_slots() -> None:
    shares = Shares()
    for _ in range(6):
        shares.started("A", 1.0)
    shares.started("B", 1.0)
    assert shares.over("A", 1.0, slots=8) and not shares.over("B", 1.0, slots=8)
    assert not shares.over("A", 1.0, slots=16)  # 6 of 16 is under half
    shares.ended("B")
    assert not shares.over("A", 1.0, slots=8)  # alone, its share is every slot
    q = FairQueue(10)
    q.push(w("C"))  # a waiting key counts in the split too
    assert shares.over("A", 1.0, slots=8, queue=q)
    shares.started("B", 3.0)
    assert not shares.over("B", 3.0, slots=8)


def test_serve_skips_a_held_back_key_for_the_keys_behind_it() -> None:
    q, b = behind_a_flood(10, 3)
    placed: list[str] = []

    def place(x: Waiter) -> bool:  # A is held back (over its share): only B fits
        if x.key == "A":
            return False
        placed.append(x.key)
        return True

    assert q.serve(0.0, place) == 1
    assert placed == ["B"] and not b.queued and len(q) == 3
    assert q.serve(0.0, lambda x: False) == 0

"""KV-aware policies: contracts, and routing behaviour over a simulated fleet with a real KvIndex."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from infera_policies.approx_prefix import register_approx_prefix
from infera_policies.kv import register_kv
from infera_policies.load import LoadScorer

from infera_core.kv.events import BlockHash, BlockRemoved, BlockStored, KvEventBatch
from infera_core.kv.index import KvIndex
from infera_core.request import RequestContext
from infera_core.scheduling.profile import Profile, build_profile
from infera_core.scheduling.types import Endpoint, SchedulerDeps
from infera_core.testing.contracts import ScorerContract, policy_suites
from infera_core.testing.policies import kv_worker_record, policy_registry
from infera_core.worker import WorkerRecord

BS = 16


REG = policy_registry(register_kv, register_approx_prefix)


class TestKvOverlapContract(ScorerContract):
    factory = REG.factory("scorer", "kv-overlap")

    def deps(self) -> SchedulerDeps:
        index = KvIndex()
        rng = random.Random(3)
        for i in range(8):
            view = index.add_view(f"w{i}", None, BS)
            toks = [rng.randrange(100) for _ in range(4 * BS)]
            index.apply(view, KvEventBatch(0.0, [BlockStored([1, 2, 3, 4], None, toks, BS)]))
        return SchedulerDeps(kv_index=index, clock=lambda: 1000.0)


globals().update(
    policy_suites(
        REG,
        "scorer:load",
        "scorer:recent-dispatch",
        "scorer:approximate-prefix",
        "scorer:cache-fill",
        "filter:imbalance-guard",
    )
)


# -- a simulated fleet: the engine caches what it is sent; requests finish at once ----------


class Fleet:
    def __init__(self, n: int, preset: str, cache_blocks: int = 10**9) -> None:
        self.index = KvIndex()
        self.now = 0.0
        self.deps = SchedulerDeps(kv_index=self.index, clock=lambda: self.now)
        self.profile: Profile = build_profile(preset, REG.preset(preset).profile, REG, self.deps)
        self.endpoints = []
        for i in range(n):
            rec = kv_worker_record(f"w{i}", BS)
            self.endpoints.append(Endpoint(rec))
            self.index.add_view(rec.worker_id, None, BS)
        self.cache_blocks = cache_blocks
        self.lru: dict[str, dict[int, None]] = {ep.worker_id: {} for ep in self.endpoints}
        self.hits = self.queries = 0
        self.picks: Counter[str] = Counter()
        self._n = 0

    def route(self, tokens: list[int]) -> str:
        self._n += 1
        ctx = RequestContext(f"r{self._n}", "m", "/v1/completions", {"prompt": tokens}, token_ids=tokens)
        cands = self.profile.filter(ctx, list(self.endpoints))
        ep = self.profile.pick(ctx, cands)
        self._engine(ep.worker_id, tokens)
        self.profile.finished(ctx, ep, True)
        self.picks[ep.worker_id] += 1
        return ep.worker_id

    def send(self, rid: str, tokens: list[int]) -> tuple[RequestContext, Endpoint]:
        """Route one request and leave it in flight."""
        ctx = RequestContext(rid, "m", "/v1/completions", {}, token_ids=tokens)
        return ctx, self.profile.pick(ctx, self.profile.filter(ctx, list(self.endpoints)))

    def _engine(self, worker: str, tokens: list[int]) -> None:
        """Like a prefix-caching engine: count hits, store the prompt's blocks, evict LRU."""
        view = self.index.view(worker, None)
        assert view is not None
        lru = self.lru[worker]
        hashes = KvIndex.hash_prompt(tokens, BS)
        hit = 0
        for h in hashes:
            if h not in lru:
                break
            hit += 1
        self.hits += hit
        self.queries += len(hashes)
        new = [i for i, h in enumerate(hashes) if h not in lru]
        for h in hashes:
            lru.pop(h, None)
            lru[h] = None
        if new:
            first = new[0]
            parent = hashes[first - 1] if first else None
            stored: list[BlockHash] = list(hashes[first:])
            ev = BlockStored(stored, parent, tokens[first * BS : len(hashes) * BS], BS)
            self.index.apply(view, KvEventBatch(0.0, [ev]))
        victims: list[BlockHash] = []
        while len(lru) > self.cache_blocks:
            oldest = next(iter(lru))
            del lru[oldest]
            victims.append(oldest)
        if victims:
            self.index.apply(view, KvEventBatch(0.0, [BlockRemoved(victims)]))

    def imbalance(self) -> float:
        counts = [self.picks[ep.worker_id] for ep in self.endpoints]
        return max(counts) / (sum(counts) / len(counts))


def _shared_prefix_workload(groups: int, per_group: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(20 * BS)] for _ in range(groups)]
    reqs = [p + [rng.randrange(1000) for _ in range(BS + 5)] for p in prefixes for _ in range(per_group)]
    rng.shuffle(reqs)
    return reqs


def test_kv_aware_beats_round_robin_on_shared_prefixes_and_stays_balanced() -> None:
    reqs = _shared_prefix_workload(32, 5)
    results = {}
    for preset in ("kv-aware", "round-robin"):
        fleet = Fleet(4, preset, cache_blocks=8 * 21)  # ~8 prefixes per worker: cache pressure
        for tokens in reqs:
            fleet.route(tokens)
        results[preset] = (fleet.hits / fleet.queries, fleet.imbalance())
    kv_hit, kv_imb = results["kv-aware"]
    rr_hit, _ = results["round-robin"]
    assert kv_hit > 1.5 * rr_hit, results
    assert kv_imb <= 1.5, results


def test_single_shared_system_prompt_does_not_collapse_onto_one_worker() -> None:
    rng = random.Random(1)
    system = [rng.randrange(1000) for _ in range(30 * BS)]
    fleet = Fleet(4, "kv-aware")
    for _ in range(200):
        fleet.route(system + [rng.randrange(1000) for _ in range(2 * BS)])
    assert min(fleet.picks.values()) > 0 and len(fleet.picks) == 4
    assert fleet.imbalance() <= 1.5, fleet.picks
    assert fleet.hits / fleet.queries > 0.7  # each worker caches the system prompt once


def test_kv_overlap_prefers_longest_prefix_and_credits_tiers() -> None:
    fleet = Fleet(3, "kv-aware")
    scorer = fleet.profile.scorers[0]
    tokens = list(range(8 * BS))
    for worker, upto, medium in (("w0", 2, "GPU"), ("w1", 6, "GPU"), ("w2", 6, "CPU")):
        view = fleet.index.view(worker, None)
        assert view is not None
        ev = BlockStored(list(range(upto)), None, tokens[: upto * BS], BS, medium=medium)
        fleet.index.apply(view, KvEventBatch(0.0, [ev]))
    ctx = RequestContext("x", "m", "/v1/completions", {}, token_ids=tokens)
    assert scorer.score(ctx, fleet.endpoints) == [2 / 8, 6 / 8, 3 / 8]
    fleet.index.untrusted.add("w1")
    ctx2 = RequestContext("y", "m", "/v1/completions", {}, token_ids=tokens)
    assert scorer.score(ctx2, fleet.endpoints) == [2 / 8, 0.0, 3 / 8]
    no_tokens = RequestContext("z", "m", "/v1/completions", {})
    assert scorer.score(no_tokens, fleet.endpoints) == [0.0, 0.0, 0.0]


def test_approximate_prefix_follows_past_decisions_and_forgets_after_ttl() -> None:
    now = [0.0]
    deps = SchedulerDeps(clock=lambda: now[0])
    cfg = REG.preset("approximate-prefix").profile
    cfg.scorers[0].params = {"ttl_s": 100.0, "chunk_chars": 16}
    profile = build_profile("ap", cfg, REG, deps)
    eps = [
        Endpoint(WorkerRecord(worker_id=f"w{i}", url=f"http://w{i}", model="m", engine="sim"))
        for i in range(4)
    ]
    docs = [f"Document {g}: " + f"fact {g} is important. " * 30 for g in range(4)]
    chosen: dict[int, list[str]] = {g: [] for g in range(4)}
    for i in range(16):
        g = i % 4
        body = {"messages": [{"role": "system", "content": docs[g]}, {"role": "user", "content": f"q{i}"}]}
        ctx = RequestContext(f"r{i}", "m", "/v1/chat/completions", body)
        ep = profile.pick(ctx, profile.filter(ctx, eps))
        profile.finished(ctx, ep, True)
        chosen[g].append(ep.worker_id)
    # each document keeps going where it went first, and the four spread over the fleet
    assert all(len(set(ws)) == 1 for ws in chosen.values()), chosen
    assert len({ws[0] for ws in chosen.values()}) == 4
    system = docs[0]
    scorer = profile.scorers[0]
    probe = RequestContext(
        "p", "m", "/v1/chat/completions", {"messages": [{"role": "system", "content": system}]}
    )
    assert max(scorer.score(probe, eps)) > 0.9
    now[0] = 1000.0
    probe2 = RequestContext(
        "p2", "m", "/v1/chat/completions", {"messages": [{"role": "system", "content": system}]}
    )
    assert scorer.score(probe2, eps) == [0.0] * 4


def test_a_repeated_prompt_stays_on_the_worker_that_cached_it() -> None:
    fleet = Fleet(2, "kv-aware")
    tokens = list(range(25 * BS))
    picks = [fleet.route(tokens) for _ in range(6)]
    assert len(set(picks)) == 1, picks
    assert fleet.hits == 5 * 25


def test_load_accounting_returns_to_zero_when_both_pd_legs_finish() -> None:
    scorer = LoadScorer()
    a, b = (Endpoint(WorkerRecord(worker_id=w, url=f"http://{w}", model="m", engine="sim")) for w in "ab")
    ctx = RequestContext("r", "m", "/v1/completions", {}, token_ids=list(range(100)))
    scorer.on_routed(ctx, a)
    scorer.on_routed(ctx, b)  # same request, second leg
    assert (a.in_flight_prompt_tokens, b.in_flight_prompt_tokens) == (100, 100)
    first = scorer.score(ctx, [a, b])
    assert first[0] == first[1]
    scorer.on_finished(ctx, a, True)
    assert scorer.score(ctx, [a, b]) == [1.0, 0.0]
    scorer.on_finished(ctx, b, True)
    assert (a.in_flight_prompt_tokens, b.in_flight_prompt_tokens) == (0, 0)


def test_a_prompt_in_flight_counts_as_cached_where_it_went_until_shortly_after_it_ends() -> None:
    """No KV event yet (the worker is still computing it, or its events lag): a request sharing
    the prefix follows it, until ``linger`` (2 s) after the request ended."""
    fleet = Fleet(4, "kv-aware")
    scorer = fleet.profile.scorers[0]
    rng = random.Random(5)
    shared = [rng.randrange(1000) for _ in range(12 * BS)]
    first = RequestContext("a", "m", "/v1/completions", {}, token_ids=shared + [1] * BS)
    ep = fleet.profile.pick(first, fleet.profile.filter(first, list(fleet.endpoints)))
    ep.in_flight += 1
    second = RequestContext("b", "m", "/v1/completions", {}, token_ids=shared + [2] * (3 * BS))
    scores = scorer.score(second, fleet.endpoints)
    assert scores[fleet.endpoints.index(ep)] == 12 / 15 and sorted(scores)[:3] == [0.0] * 3
    assert fleet.profile.pick(second, fleet.profile.filter(second, list(fleet.endpoints))) is ep
    fleet.profile.finished(first, ep, True)
    fleet.profile.finished(second, ep, True)
    third = RequestContext("c", "m", "/v1/completions", {}, token_ids=shared)
    fleet.now = 1.9  # ended well 1.9 s ago: its events may still be on the way
    assert scorer.score(third, fleet.endpoints)[fleet.endpoints.index(ep)] == 1.0
    assert fleet.profile.pick(third, fleet.profile.filter(third, list(fleet.endpoints))) is ep
    fleet.profile.finished(third, ep, False)  # (its own credit ends with it: it failed)
    fleet.now = 2.0
    assert scorer.score(third, fleet.endpoints) == [0.0] * 4  # no events came: nothing is assumed


def test_a_failed_request_stops_counting_as_cached_at_once() -> None:
    fleet = Fleet(4, "kv-aware")
    scorer = fleet.profile.scorers[0]
    shared = list(range(8 * BS))
    first, ep = fleet.send("a", shared)
    probe = RequestContext("p", "m", "/v1/completions", {}, token_ids=shared)
    assert scorer.score(probe, fleet.endpoints)[fleet.endpoints.index(ep)] == 1.0
    fleet.profile.finished(first, ep, False)
    assert scorer.score(probe, fleet.endpoints) == [0.0] * 4


def test_a_request_id_sent_again_while_its_credit_lingers_counts_until_the_new_one_ends() -> None:
    fleet = Fleet(2, "kv-aware")
    scorer = fleet.profile.scorers[0]
    shared = list(range(8 * BS))
    ctx, ep = fleet.send("same", shared)
    fleet.profile.finished(ctx, ep, True)  # lingers until 2.0
    fleet.now = 1.0
    again = RequestContext("same", "m", "/v1/completions", {}, token_ids=shared)
    scorer.on_routed(again, ep)  # in flight again: no end time until it ends
    fleet.now = 5.0
    assert scorer.score(again, fleet.endpoints)[fleet.endpoints.index(ep)] == 1.0
    fleet.profile.finished(again, ep, True)
    fleet.now = 6.9
    assert scorer.score(again, fleet.endpoints)[fleet.endpoints.index(ep)] == 1.0
    fleet.now = 7.0
    assert scorer.score(again, fleet.endpoints) == [0.0] * 2


def test_linger_zero_keeps_the_credit_only_while_in_flight() -> None:
    reg_profile = REG.preset("kv-aware").profile
    scorers = [
        s.model_copy(update={"params": {"linger": 0}}) if s.name == "kv-overlap" else s
        for s in reg_profile.scorers
    ]
    fleet = Fleet(2, "kv-aware")
    fleet.profile = build_profile(
        "kv-aware", reg_profile.model_copy(update={"scorers": scorers}), REG, fleet.deps
    )
    scorer = fleet.profile.scorers[0]
    ctx, ep = fleet.send("a", list(range(8 * BS)))
    fleet.profile.finished(ctx, ep, True)
    assert scorer.score(ctx, fleet.endpoints) == [0.0] * 2


def test_an_uncached_prompt_goes_where_the_cache_took_fewest_new_blocks() -> None:
    fleet = Fleet(3, "kv-aware")
    fill = next(s for s in fleet.profile.scorers if s.name == "cache-fill")
    a, b, c = fleet.endpoints
    cached = list(range(100, 100 + 8 * BS))
    view = fleet.index.view("w0", None)
    assert view is not None
    fleet.index.apply(view, KvEventBatch(0.0, [BlockStored(list(range(8)), None, cached, BS)]))
    # w0 was sent 8 cached blocks + 2 new ones, w1 6 new blocks, w2 nothing
    for rid, ep, toks in (("x", a, cached + list(range(2 * BS))), ("y", b, list(range(6 * BS)))):
        fill.on_routed(RequestContext(rid, "m", "/v1/completions", {}, token_ids=toks), ep)
    probe = RequestContext("p", "m", "/v1/completions", {}, token_ids=[7] * (4 * BS))
    # (w0's count has decayed by one dispatch since)
    assert fill.score(probe, [a, b, c]) == pytest.approx([1 - 2 / 6, 0.0, 1.0], abs=0.01)


def test_cache_fill_stays_finite_and_ordered_over_many_half_lives() -> None:
    deps = SchedulerDeps(kv_index=KvIndex(), clock=lambda: 0.0)
    factory = REG.factory("scorer", "cache-fill")
    fill = factory.build(factory.parse_params({"half_life": 2.0}), deps)
    a, b, c = (Endpoint(WorkerRecord(worker_id=w, url=f"http://{w}", model="m", engine="sim")) for w in "abc")
    for i in range(3000):  # 1500 half-lives (2 ** 1500 overflows a double): the scale is folded back
        ep, n = (a, 100) if i % 2 else (b, 50)
        fill.on_routed(RequestContext(f"r{i}", "m", "/v1/completions", {}, token_ids=[1] * n), ep)
    got = fill.score(RequestContext("p", "m", "/v1/completions", {}, token_ids=[2] * 64), [a, b, c])
    assert got[2] == 1.0 and got[0] == 0.0 and 0.0 < got[1] < 1.0, got


def test_lingering_credits_expire_even_when_nothing_is_scored() -> None:
    """One worker: the profile never scores, so only sending expires credits; they must not pile up."""
    fleet = Fleet(1, "kv-aware")
    scorer = fleet.profile.scorers[0]
    ep = fleet.endpoints[0]
    for i in range(50):
        fleet.now = float(i)
        ctx = RequestContext(f"r{i}", "m", "/v1/completions", {}, token_ids=[i] * (4 * BS))
        scorer.on_routed(ctx, ep)
        fleet.profile.finished(ctx, ep, True)
    in_flight = scorer.in_flight  # type: ignore[attr-defined]
    assert len(in_flight.sent) <= 3 and len(in_flight.ending) <= 3

"""The array path routes exactly like the per-worker path it replaces, on random fleets.

Each fleet is random (roles, statuses, breakers, loads, engine queues, recent dispatches,
KV views with shared prefixes on two tiers, stale and untrusted views); between requests
the fleet changes (records replaced, breakers opening and falling due, views going stale,
workers flagged untrusted, requests finishing). Every request is decided twice, by the
per-worker Python path (the specification) and by the array path, and both must keep the
same candidates and pick the same worker. The cached filters must equal the old
per-request list comprehensions.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest
from infera_policies.basic import register_basic
from infera_policies.kv import register_kv
from infera_policies.load import ImbalanceGuard

from infera_core.kv import accel
from infera_core.kv.events import BlockStored, KvEventBatch
from infera_core.kv.index import KvIndex
from infera_core.request import RequestContext
from infera_core.scheduling.profile import Profile, build_profile
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.scheduler import under_cap
from infera_core.scheduling.types import Endpoint, Picker, SchedulerDeps, Scorer
from infera_core.testing.policies import kv_worker_record, policy_registry
from infera_core.worker import Role, Status, WorkerRecord

BS = 16
PRESETS = ("kv-aware", "kv-aware-prefill", "kv-aware-decode", "least-load")


def _registry() -> PolicyRegistry:
    return policy_registry(register_basic, register_kv)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _record(rng: random.Random, i: int, block_size: int) -> WorkerRecord:
    return kv_worker_record(
        f"w{i}",
        block_size,
        role=rng.choice([Role.MIXED, Role.MIXED, Role.MIXED, Role.PREFILL]),
        status=Status.ACTIVE if rng.random() < 0.9 else Status.DRAINING,
    )


def _fleet(
    rng: random.Random, n: int, clock: Clock, prefixes: list[list[int]]
) -> tuple[KvIndex, list[Endpoint]]:
    index = KvIndex()
    eps = []
    for i in range(n):
        ep = Endpoint(_record(rng, i, BS))
        ep.in_flight = rng.randrange(6)
        ep.in_flight_prompt_tokens = ep.in_flight * rng.randrange(0, 3000)
        ep.recent_dispatch = rng.random() * 4
        ep.recent_dispatch_ts = float(rng.randrange(0, 40))
        if rng.random() < 0.3:
            ep.stats = {"waiting": float(rng.randrange(4)), "running": 1.0}
        if rng.random() < 0.1:
            ep.breaker_open = True
            ep.breaker_retry_at = clock.now + rng.choice([-1.0, 5.0, 50.0])
        eps.append(ep)
        view = index.add_view(ep.worker_id, None, BS)
        for j in rng.sample(range(len(prefixes)), rng.randrange(0, 3)):
            toks = prefixes[j][: BS * rng.randrange(1, len(prefixes[j]) // BS + 1)]
            hashes: list[int | bytes] = [(i << 32) + (j << 16) + k for k in range(len(toks) // BS)]
            medium = rng.choice([None, None, "CPU"])
            index.apply(view, KvEventBatch(0.0, [BlockStored(hashes, None, toks, BS, medium=medium)]))
    return index, eps


def _reference_filter(eps: list[Endpoint], role: Role, now: float) -> list[str]:
    """The health and role filters as they were: one list comprehension per request."""
    out = [ep for ep in eps if ep.record.status is Status.ACTIVE]
    if any(ep.breaker_open for ep in out):
        out = [ep for ep in out if not ep.breaker_open or now >= ep.breaker_retry_at]
    return [ep.worker_id for ep in out if ep.record.role is role]


def _set_array_min(profile: Profile, value: int) -> None:
    profile.array_min = value
    for f in profile.filters:
        if isinstance(f, ImbalanceGuard):
            f.array_min = value


def _mutate(rng: random.Random, eps: list[Endpoint], index: KvIndex, clock: Clock) -> list[Endpoint]:
    """One random fleet change; returns the (possibly rebuilt) candidate list."""
    ep = rng.choice(eps)
    what = rng.randrange(7)
    if what == 0:
        ep.breaker_open = not ep.breaker_open
        ep.breaker_retry_at = clock.now + rng.choice([0.5, 3.0])
    elif what == 1:
        clock.now += rng.choice([0.25, 1.0, 4.0])
    elif what == 2:
        status = Status.DRAINING if ep.record.status is Status.ACTIVE else Status.ACTIVE
        ep.record = ep.record.model_copy(update={"status": status})
    elif what == 3:
        view = index.view(ep.worker_id)
        if view is not None:
            index.set_stale(view, not view.stale)
    elif what == 4:
        if ep.worker_id in index.untrusted:
            index.untrusted.discard(ep.worker_id)
        else:
            index.untrusted.add(ep.worker_id)
    elif what == 5:
        ep.in_flight = max(0, ep.in_flight + rng.choice([-1, 1, 3]))
        ep.stats = {"waiting": float(rng.randrange(5))} if rng.random() < 0.5 else {}
    else:
        return list(eps)  # the table rebuilt its list (a worker joined or left)
    return eps


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("seed", range(4))
def test_array_path_routes_like_the_per_worker_path(preset: str, seed: int) -> None:
    rng = random.Random(seed * 101 + len(preset))
    clock = Clock()
    prefixes = [[rng.randrange(50) for _ in range(BS * 12)] for _ in range(6)]
    index, eps = _fleet(rng, rng.randrange(50, 220), clock, prefixes)
    reg = _registry()
    deps = SchedulerDeps(kv_index=index, clock=clock)
    spec = build_profile(preset, reg.preset(preset).profile, reg, deps)
    fast = build_profile(preset, reg.preset(preset).profile, reg, deps)
    _set_array_min(spec, 10**9)
    _set_array_min(fast, 0)
    assert fast.vectorized
    cands = list(eps)
    routed: list[tuple[RequestContext, Endpoint]] = []
    for r in range(120):
        if rng.random() < 0.5:
            cands = _mutate(rng, eps, index, clock)
        role = Role.PREFILL if rng.random() < 0.2 else Role.MIXED
        j = rng.randrange(len(prefixes))
        toks = prefixes[j][: BS * rng.randrange(0, 12)] + [
            rng.randrange(50) for _ in range(rng.randrange(0, 40))
        ]
        ctx = RequestContext(f"r{r}", "m", "/v1/completions", {"prompt": "x"}, role=role, token_ids=toks)
        a = spec.filter(ctx, cands)
        b = fast.filter(ctx, cands)
        assert [e.worker_id for e in a] == [e.worker_id for e in b]
        if not a:
            continue
        ref = _reference_filter(cands, role, clock.now)
        if "kv-aware" not in preset:  # no guard: exactly the old health + role result
            assert [e.worker_id for e in a] == ref
        else:
            assert {e.worker_id for e in a} <= set(ref)
        chosen_spec = spec.picker.pick(ctx, a, spec._scores(ctx, a))
        chosen_fast = fast._pick_rows(ctx, b)
        assert chosen_spec is chosen_fast, f"request {r}: {chosen_spec} vs {chosen_fast}"
        for scorer in spec.scorers:
            scorer.on_routed(ctx, chosen_spec)
        chosen_spec.in_flight += 1
        routed.append((ctx, chosen_spec))
        if routed and rng.random() < 0.4:
            done_ctx, done_ep = routed.pop(rng.randrange(len(routed)))
            done_ep.in_flight -= 1
            spec.finished(done_ctx, done_ep, True)


def test_health_filter_sees_breakers_fall_due_without_a_fleet_change() -> None:
    reg = _registry()
    clock = Clock()
    profile = build_profile("round-robin", reg.preset("round-robin").profile, reg, SchedulerDeps(clock=clock))
    rng = random.Random(7)
    eps = [Endpoint(_record(rng, i, BS).model_copy(update={"role": Role.MIXED})) for i in range(60)]
    for ep in eps:
        ep.record = ep.record.model_copy(update={"status": Status.ACTIVE})
    eps[3].breaker_open = True
    eps[3].breaker_retry_at = clock.now + 10
    ctx = RequestContext("r", "m", "/v1/completions", {})
    assert "w3" not in {e.worker_id for e in profile.filter(ctx, eps)}
    assert profile.filter(ctx, eps) is profile.filter(ctx, eps)  # cached while nothing changes
    clock.now += 10  # the half-open probe is due: w3 is a candidate again
    assert "w3" in {e.worker_id for e in profile.filter(ctx, eps)}
    eps[5].record = eps[5].record.model_copy(update={"status": Status.DRAINING})
    assert "w5" not in {e.worker_id for e in profile.filter(ctx, eps)}


def test_in_flight_cap_over_arrays_keeps_the_same_workers() -> None:
    rng = random.Random(5)
    eps = [Endpoint(_record(rng, i, BS)) for i in range(200)]
    for ep in eps:
        ep.in_flight = rng.randrange(10)
    for cap in (1, 4, 9, 10):
        assert [e.worker_id for e in under_cap(eps, cap)] == [e.worker_id for e in eps if e.in_flight < cap]
    assert under_cap(eps, 0) == []


@pytest.mark.parametrize("native", [True, False])
def test_match_over_slot_arrays_equals_the_list_match(native: bool) -> None:
    before = accel.ops
    accel.use_native(native)
    try:
        rng = random.Random(11)
        prefixes = [[rng.randrange(50) for _ in range(BS * 12)] for _ in range(6)]
        index, eps = _fleet(rng, 150, Clock(), prefixes)
    finally:
        accel.ops = before
    views = [index.view(ep.worker_id) for ep in eps]
    for k in range(30):
        toks = prefixes[k % 6][: BS * rng.randrange(1, 13)]
        hashes = index.hash_prompt(toks, BS)
        picked = [rng.choice(views) if rng.random() < 0.9 else None for _ in range(rng.randrange(1, 200))]
        slots = np.array([-1 if v is None else v.slot for v in picked], np.int64)
        assert index.match_slots(hashes, slots, (1.0, 0.5, 0.25)).tolist() == index.match(hashes, picked)


class _Fixed(Scorer):
    def __init__(self, values: list[float], bounded: bool) -> None:
        self.values = values
        self.bounded = bounded

    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        return list(self.values)

    def score_rows(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> np.ndarray:
        return np.array(self.values)


class _Totals(Picker):
    def __init__(self) -> None:
        self.totals: list[float] = []

    def pick_rows(self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: np.ndarray) -> Endpoint:
        self.totals = scores.tolist()
        return candidates[0]


def test_the_weighted_sum_clips_scores_except_a_bounded_scorers() -> None:
    """``Scorer.bounded`` (its arrays are within [0, 1] by construction): weighed as they are,
    the clipping pass skipped; every other scorer's are clipped to [0, 1] first."""
    eps = [Endpoint(kv_worker_record(f"w{i}", BS)) for i in range(3)]
    picker = _Totals()
    scorers = [(_Fixed([1.5, -1.0, 0.5], False), 2.0), (_Fixed([0.25, 1.0, 0.0], True), 4.0)]
    profile = Profile("p", [], scorers, picker)
    assert profile.bounded == (False, True)
    profile.array_min = 0
    profile.pick(RequestContext("r", "m", "/v1/completions", {}), eps)
    assert picker.totals == [2.0 + 1.0, 0.0 + 4.0, 1.0 + 0.0]

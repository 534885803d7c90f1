"""The ``predicted-latency`` scorer: its online model (cold start, drift, queue), SLO-aware
picking, and what it reports (predicted vs observed TTFT, the prediction error)."""

from __future__ import annotations

import math

from infera_policies.basic import register_basic
from infera_policies.kv import register_kv
from infera_policies.predicted import PredictedLatencyScorer, PredictParams, register_predicted
from infera_policies.predicted_guard import PREDICTOR_KEY, PredictedGuard, PredictedGuardParams

from infera_core.request import RequestContext
from infera_core.scheduling.candidates import Candidates
from infera_core.scheduling.profile import build_profile
from infera_core.scheduling.types import Endpoint, LatencyStats, SchedulerDeps
from infera_core.testing.contracts import ScorerContract
from infera_core.testing.policies import kv_worker_record, policy_registry

REG = policy_registry(register_basic, register_kv, register_predicted)


class TestPredictedLatencyContract(ScorerContract):
    factory = REG.factory("scorer", "predicted-latency")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fleet(n: int) -> list[Endpoint]:
    return [Endpoint(kv_worker_record(f"w{i}", 16)) for i in range(n)]


def ctx(i: int, tokens: int = 1000, headers: dict[str, str] | None = None) -> RequestContext:
    return RequestContext(f"r{i}", "m", "/v1/completions", {}, headers or {}, token_ids=list(range(tokens)))


def serve(
    scorer: PredictedLatencyScorer, clock: Clock, ep: Endpoint, i: int, rate: float, tokens: int = 1000
) -> None:
    """Route one request to ``ep`` on an idle worker that prefills ``rate`` tokens/s; its first token."""
    c = ctx(i, tokens)
    scorer.score(c, [ep])
    scorer.on_routed(c, ep)
    clock.now += tokens / rate
    scorer.on_first_token(c, ep)
    scorer.on_finished(c, ep, True)
    clock.now += 0.05


def learned_slow_and_fast(s: PredictedLatencyScorer, clock: Clock) -> list[Endpoint]:
    """Two workers measured ten times each: one prefilling 2000 tokens/s, the other 8000."""
    slow, fast = fleet(2)
    for i in range(10):
        serve(s, clock, slow, i, 2000.0)
        serve(s, clock, fast, 100 + i, 8000.0)
    return [slow, fast]


def test_cold_start_uses_the_prior_then_learns_the_worker_rate() -> None:
    clock = Clock()
    s = PredictedLatencyScorer(None, PredictParams(prior_tokens_per_s=10000, min_observations=4), clock=clock)
    (ep,) = fleet(1)
    s.score(ctx(0), [ep])
    assert abs(float(s.rates([ep.row])[0]) - 10000) < 1  # no observation: the prior
    for i in range(30):
        serve(s, clock, ep, i, 2500.0)
    assert abs(float(s.rates([ep.row])[0]) - 2500) / 2500 < 0.15


def test_drift_a_worker_that_slows_down_is_relearned_within_seconds() -> None:
    clock = Clock()
    s = PredictedLatencyScorer(None, PredictParams(half_life=2.0), clock=clock)
    (ep,) = fleet(1)
    for i in range(40):
        serve(s, clock, ep, i, 20000.0)
    assert abs(float(s.rates([ep.row])[0]) - 20000) / 20000 < 0.15
    start = clock.now
    i = 100
    while abs(float(s.rates([ep.row])[0]) - 5000) / 5000 > 0.2:  # now 4× slower
        serve(s, clock, ep, i, 5000.0)
        i += 1
        assert clock.now - start < 10.0, "not re-learned within 10 s"


def test_queued_work_raises_the_predicted_ttft_and_sends_the_next_request_elsewhere() -> None:
    clock = Clock()
    s = PredictedLatencyScorer(None, PredictParams(exploration=0), clock=clock)
    a, b = fleet(2)
    first = s.score(ctx(0), [a, b])
    assert first[0] == first[1]
    s.on_routed(ctx(0), a)
    after = s.score(ctx(1), [a, b])
    assert after[1] > after[0]  # a has 1000 tokens queued ahead


def test_the_fast_worker_is_preferred_once_learned() -> None:
    clock = Clock()
    s = PredictedLatencyScorer(None, PredictParams(exploration=0), clock=clock)
    slow, fast = learned_slow_and_fast(s, clock)
    scores = s.score(ctx(999), [slow, fast])
    assert scores[1] == 1.0 and scores[0] < 0.6


def test_slo_targets_pick_a_worker_that_meets_them_else_the_least_violating() -> None:
    clock = Clock()
    s = PredictedLatencyScorer(None, PredictParams(exploration=0), clock=clock)
    slow, fast = learned_slow_and_fast(s, clock)
    # TPOT: the fast worker decodes in a big batch (slow ITL), the slow one alone
    for k in range(10):
        s.on_timing(ctx(500 + k), slow, 0.1, 0.010)
    fast.in_flight = 40
    for k in range(10):
        s.on_timing(ctx(600 + k), fast, 0.1, 0.080)
    both = {"x-infera-ttft-target-ms": "2000", "x-infera-tpot-target-ms": "30"}
    scores = s.score(ctx(1, headers=both), [slow, fast])
    assert scores[0] > scores[1]  # only the slow one meets the TPOT target
    # TTFT alone: the fast one (0.125 s) meets 300 ms, the slow one (0.5 s) does not
    scores = s.score(ctx(2, headers={"x-infera-ttft-target-ms": "300"}), [slow, fast])
    assert scores[1] > scores[0]
    # nobody meets 10 ms: the least violating (the fast one) scores highest
    scores = s.score(ctx(3, headers={"x-infera-ttft-target-ms": "10"}), [slow, fast])
    assert scores[1] == 1.0 and scores[0] < 1.0


def test_the_key_default_target_applies_when_the_request_names_none() -> None:
    class Key:
        ttft_target_ms = 300.0
        tpot_target_ms = None

    class Principal:
        key = Key()

    clock = Clock()
    s = PredictedLatencyScorer(None, PredictParams(exploration=0), clock=clock)
    slow, fast = learned_slow_and_fast(s, clock)
    c = ctx(7)
    c.principal = Principal()
    scores = s.score(c, [slow, fast])
    assert scores[1] >= 0.5 > scores[0]  # meets → above every worker that does not


def test_exploration_sends_a_small_share_to_other_workers() -> None:
    clock = Clock()
    s = PredictedLatencyScorer(None, PredictParams(exploration=0.1, seed=1), clock=clock)
    slow, fast = learned_slow_and_fast(s, clock)
    picks = [max(range(2), key=lambda j, sc=s.score(ctx(i), [slow, fast]): sc[j]) for i in range(400)]
    explored = picks.count(0) / len(picks)
    assert 0.01 < explored < 0.15


def test_predicted_and_observed_ttft_and_the_error_are_reported() -> None:
    clock = Clock()
    stats = LatencyStats()
    s = PredictedLatencyScorer(None, PredictParams(prior_tokens_per_s=4000), clock=clock, stats=stats)
    (ep,) = fleet(1)
    serve(s, clock, ep, 0, 2000.0)  # predicted 0.25 s, observed 0.5 s
    assert abs(stats.predicted["w0"] - 0.25) < 1e-6
    assert abs(stats.observed["w0"] - 0.5) < 1e-6
    assert stats.mae is not None and abs(stats.mae - 0.25) < 1e-6


def test_the_preset_builds_and_routes() -> None:
    clock = Clock()
    deps = SchedulerDeps(clock=clock)
    profile = build_profile("predicted-latency", REG.preset("predicted-latency").profile, REG, deps)
    eps = fleet(3)
    c = ctx(0)
    chosen = profile.pick(c, profile.filter(c, eps))
    clock.now += 0.1
    profile.first_token(c, chosen)
    profile.finished(c, chosen, True)
    assert deps.latency.observed[chosen.worker_id] > 0


def test_scale_s_weighs_ttft_differences_in_seconds_whatever_the_queue() -> None:
    """The ratio form shrinks a 0.2 s difference behind a long queue; ``scale_s`` does not."""
    clock = Clock()
    s = PredictedLatencyScorer(None, PredictParams(exploration=0, scale_s=0.5), clock=clock)
    a, b = fleet(2)
    for i in range(8):  # 8000 tokens queued on a, 8000 + 800 on b (10000 tokens/s: 0.8 s vs 0.88 s)
        s.on_routed(ctx(i), a)
        s.on_routed(ctx(100 + i), b)
    s.on_routed(ctx(200, tokens=800), b)
    near = s.score(ctx(300), [a, b])
    assert near[0] == 1.0 and abs(near[1] - math.exp(-0.08 / 0.5)) < 1e-6
    ratio = PredictedLatencyScorer(None, PredictParams(exploration=0), clock=clock)
    assert ratio.p.scale_s is None


def test_predicted_guard_drops_workers_whose_backlog_is_gap_s_longer() -> None:
    clock = Clock()
    deps = SchedulerDeps(clock=clock)
    profile = build_profile("predicted-latency", REG.preset("predicted-latency").profile, REG, deps)
    a, b, c = fleet(3)
    scorer = deps.extra[PREDICTOR_KEY]
    guard = PredictedGuard(deps.extra, PredictedGuardParams(gap_s=1.0))
    assert guard.filter(ctx(0), [a, b, c]) == [a, b, c]  # nothing queued
    for i in range(15):  # 15000 tokens at the 10000 tokens/s prior: 1.5 s of backlog on a
        scorer.on_routed(ctx(i), a)
    scorer.on_routed(ctx(50), b)  # 0.1 s on b
    assert [ep.worker_id for ep in guard.filter(ctx(99), [a, b, c])] == ["w1", "w2"]
    clock.now += 1.0  # a's backlog drains: 0.5 s left, within the gap
    assert guard.filter(ctx(100), [a, b, c]) == [a, b, c]
    assert guard.filter(ctx(101), [a]) == [a]  # never every candidate
    assert any(f.name == "predicted-guard" for f in profile.filters)


def test_requests_queued_behind_others_learn_how_much_later_than_the_queue_they_come() -> None:
    """An engine batches queued prompts into steps, so one queued behind another answers later
    than ``busy + uncached / rate`` says: the worker's queued-behind term learns the gap."""
    clock = Clock()
    s = PredictedLatencyScorer(None, PredictParams(exploration=0, min_observations=1e9), clock=clock)
    a, b = fleet(2)
    for i in range(20):  # 1000 tokens at the 10000 tokens/s prior: 0.1 s each
        first, second = ctx(2 * i), ctx(2 * i + 1)
        s.on_routed(first, a)
        s.on_routed(second, a)  # queued behind ``first``: predicted at 0.2 s, comes at 0.5 s
        clock.now += 0.1
        s.on_first_token(first, a)
        clock.now += 0.4
        s.on_first_token(second, a)
        clock.now += 1.0
    s.on_routed(ctx(100), a)
    _, _, ttft = s.predict(ctx(101), [a, b])
    assert 0.32 < float(ttft[0]) < 0.55  # observed 0.5 s; the queue model alone: 0.2 s
    assert abs(float(ttft[1]) - 0.1) < 1e-9  # an idle worker: no queued-behind term


class CountingClock(Clock):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def test_the_guard_and_the_scorer_share_one_backlog_pass_per_decision() -> None:
    """``predicted-guard`` computes each candidate's backlog; the scorer reuses it for the same
    request over the same rows (one clock reading, one pass over the fleet), never for a retry."""
    clock = CountingClock()
    scorer = PredictedLatencyScorer(None, clock=clock)
    guard = PredictedGuard({PREDICTOR_KEY: scorer})
    eps = Candidates(fleet(64))
    for i in range(5):
        scorer.on_routed(ctx(i), eps[3])  # a backlog on one worker, within the gap
    c = ctx(99)
    kept = guard.filter(c, eps)
    assert kept is eps
    reads = clock.reads
    shared = scorer.score_rows(c, kept)
    assert clock.reads == reads  # the guard's backlog: no second pass
    again = scorer.score_rows(c, kept)  # the same request scored again (a retry): read afresh
    assert clock.reads == reads + 1
    assert shared.tolist() == again.tolist()
    assert int(shared.argmax()) != 3


def test_a_run_of_rows_and_the_same_rows_in_any_order_predict_the_same() -> None:
    """The columns are read as a view when the candidates' rows are one ascending run, else
    gathered: the same predictions either way."""
    clock = Clock()
    scorer = PredictedLatencyScorer(None, clock=clock)
    eps = sorted(fleet(64), key=lambda ep: ep.row)
    for i, ep in enumerate(eps[::7]):
        serve(scorer, clock, ep, i, 2000.0 + 500 * i)
    scorer.on_routed(ctx(500), eps[5])
    run = Candidates(eps)
    shuffled = Candidates(eps[::-1])
    if int(run.rows[-1]) - int(run.rows[0]) == len(run) - 1:
        assert isinstance(scorer._at(run.rows), slice)
    assert not isinstance(scorer._at(shuffled.rows), slice)
    forward = scorer.predict(ctx(1000), run)[2]
    backward = scorer.predict(ctx(1000), shuffled)[2]
    assert forward.tolist() == backward[::-1].tolist()
    assert forward.max() > forward.min()


def test_fully_cached_prompts_never_drive_a_rate_to_zero() -> None:
    """Every prompt answered from cache (nothing to prefill: a load test repeating one prompt)
    teaches no prefill rate: the next uncached prompt is still routed, with a finite prediction."""
    clock = Clock()
    s = PredictedLatencyScorer(None, PredictParams(exploration=0.0), clock=clock)
    eps = fleet(2)
    for i in range(40):  # each first token 20 ms after routing, with nothing to prefill
        c, ep = ctx(i, tokens=0), eps[i % 2]
        s.score(c, [ep])
        s.on_routed(c, ep)
        clock.now += 0.02
        s.on_first_token(c, ep)
        s.on_finished(c, ep, True)
    c = ctx(99)
    scores = s.score(c, eps)
    s.on_routed(c, eps[0])
    assert all(math.isfinite(x) for x in scores), scores
    assert all(0 < r < math.inf for r in s.rates([ep.row for ep in eps]))

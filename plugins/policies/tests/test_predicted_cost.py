"""What ``predicted-latency`` skips to stay within ``kv-aware``'s cost per decision, and that the
scores are still, to the bit, the straightforward formula's."""

from __future__ import annotations

import random

import numpy as np
from infera_policies.basic import register_basic
from infera_policies.in_flight import InFlightPrefixes
from infera_policies.kv import register_kv
from infera_policies.predicted import PredictedLatencyScorer, PredictParams, register_predicted
from infera_policies.predicted_guard import PREDICTOR_KEY, PredictedGuard

from infera_core.request import RequestContext
from infera_core.scheduling.candidates import Candidates
from infera_core.scheduling.profile import build_profile
from infera_core.scheduling.types import TPOT_TARGET_HEADER, TTFT_TARGET_HEADER, Endpoint, SchedulerDeps
from infera_core.testing.policies import kv_worker_record, policy_registry


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fleet(n: int) -> Candidates:
    return Candidates([Endpoint(kv_worker_record(f"w{i}", 16)) for i in range(n)])


def ctx(i: int, tokens: int = 1000) -> RequestContext:
    return RequestContext(f"r{i}", "m", "/v1/completions", {}, {}, token_ids=list(range(tokens)))


def test_no_backlog_pass_while_every_queue_is_empty() -> None:
    """At light load every queue is empty when the next request comes: the guard and the scorer
    then skip the pass over the fleet (all backlogs 0); a routed request's queue brings it back
    until its first token comes."""
    clock = Clock()
    scorer = PredictedLatencyScorer(None, clock=clock)
    guard = PredictedGuard({PREDICTOR_KEY: scorer})
    eps = fleet(64)
    assert scorer.request_backlog(ctx(0), eps.rows) is None
    assert guard.filter(ctx(1), eps) is eps
    scorer.on_routed(ctx(2), eps[5])  # 0.1 s of prefill queued on w5
    wait = scorer.request_backlog(ctx(3), eps.rows)
    assert wait is not None and float(wait[5]) > 0 and float(wait.max()) == float(wait[5])
    clock.now += 0.02
    scorer.on_first_token(ctx(2), eps[5])  # sooner than predicted: the queue moves to now
    assert scorer.request_backlog(ctx(4), eps.rows) is None
    for i in range(3):  # overwritten busy times (stale entries) are dropped as they surface
        scorer.on_routed(ctx(10 + i), eps[i])
    clock.now += 1.0  # every queue drained
    assert scorer.request_backlog(ctx(20), eps.rows) is None


def reference(
    s: PredictedLatencyScorer, eps: Candidates, overlap: np.ndarray, tokens: int, now: float
) -> np.ndarray:
    """The scores as the formula reads, from the scorer's columns, one array operation at a time."""
    c = {k: v[eps.rows] for k, v in s._cols.items()}
    wait = np.maximum(c["busy"] - now, 0.0)
    uncached = (1.0 - np.minimum(np.maximum(overlap, 0.0), 1.0)) * float(tokens)
    ttft = uncached / c["rate"] + wait
    if s._queued_term:
        ttft = np.where(wait > 0, ttft + c["qerr"], ttft)
    scale = s.p.scale_s
    if scale is None:
        eps_s = s.p.slack_ms / 1000.0
        return (ttft.min() + eps_s) / (ttft + eps_s)  # type: ignore[no-any-return]
    return np.exp((ttft - ttft.min()) * (-1.0 / scale))  # type: ignore[no-any-return]


def test_scores_equal_the_straightforward_formula_bit_for_bit_on_random_traffic() -> None:
    """Random arrivals, overlaps and first tokens (queues empty and not, the queued-behind term
    learned): every decision's scores equal :func:`reference`'s to the last bit, with and without
    ``scale_s``, whichever path (the guard's backlog reused, or none to compute) was taken."""
    for scale_s in (0.3, None):
        rng = random.Random(7)
        clock = Clock()
        shared = InFlightPrefixes(clock)
        s = PredictedLatencyScorer(None, PredictParams(scale_s=scale_s, exploration=0.0), shared, clock)
        guard = PredictedGuard({PREDICTOR_KEY: s})
        eps = fleet(96)
        pending: list[tuple[RequestContext, Endpoint]] = []
        idle = busy = 0
        for i in range(1500):
            tokens = rng.choice([16, 1000, 4000])
            c = ctx(i, tokens)
            overlap = np.array([rng.random() * 0.95 - 0.05 if rng.random() < 0.2 else 0.0 for _ in eps])
            shared.last = (c.request_id, eps.rows, overlap.copy())  # kv-overlap scored it just before
            kept = guard.filter(c, eps)
            if kept is eps:
                want = reference(s, eps, overlap, tokens, clock.now)
                got = s.score_rows(c, eps)
                assert got.tobytes() == want.tobytes(), i
                if s._latest.busy_after(clock.now, s._cols["busy"]):
                    busy += 1
                else:
                    idle += 1
                ep = eps[int(got.argmax())]
            else:
                ep = kept[0]
                s.score_rows(c, kept)
            s.on_routed(c, ep)
            pending.append((c, ep))
            clock.now += rng.choice([0.0, 0.001, 0.01, 0.05, 0.4])
            while pending and rng.random() < 0.6:
                done, where = pending.pop(rng.randrange(len(pending)))
                s.on_first_token(done, where)
                s.on_finished(done, where, True)
        assert idle > 100 and busy > 100 and s._queued_term


def test_its_scores_are_within_0_1_so_the_profile_weighs_them_unclipped() -> None:
    """``bounded``: every score is in [0, 1] by construction (with and without targets, explored
    or not), so the preset's weighted sum skips the clipping pass for this scorer (only)."""
    reg = policy_registry(register_basic, register_kv, register_predicted)
    clock = Clock()
    deps = SchedulerDeps(clock=clock)
    profile = build_profile("predicted-latency", reg.preset("predicted-latency").profile, reg, deps)
    flags = dict(zip((sc.name for sc in profile.scorers), profile.bounded, strict=True))
    assert flags.pop("predicted-latency") is True and not any(flags.values())
    for scale_s in (0.3, None):
        rng = random.Random(3)
        s = PredictedLatencyScorer(None, PredictParams(exploration=0.3, scale_s=scale_s), None, clock)
        eps = fleet(32)
        for i in range(400):
            headers = {}
            if rng.random() < 0.5:
                headers[TTFT_TARGET_HEADER] = str(rng.choice([1, 50, 300, 5000]))
            if rng.random() < 0.3:
                headers[TPOT_TARGET_HEADER] = str(rng.choice([1, 20, 200]))
            c = RequestContext(f"r{i}", "m", "/v1/completions", {}, headers, token_ids=list(range(1000)))
            scores = s.score_rows(c, eps)
            assert float(scores.min()) >= 0.0 and float(scores.max()) <= 1.0, (i, headers)
            ep = eps[int(scores.argmax())]
            s.on_routed(c, ep)
            clock.now += rng.choice([0.0, 0.01, 0.2])
            s.on_first_token(c, ep)
            s.on_timing(c, ep, 0.5, rng.choice([None, 0.01, 0.05]))
            s.on_finished(c, ep, True)

"""bench/fleet/fairness.py: the router queue on a saturated fleet of real SimEngines, virtual time.

A small fleet and a short replay (seconds): the flooded light key is never refused with the
queue (it is without), two over-demanding keys split the tokens by their weights, and every
deadline refusal is answered before its deadline; the report prints."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from bench.fleet import fairness as fb


@pytest.fixture(scope="module")
def args() -> argparse.Namespace:
    return argparse.Namespace(
        sims=2, cap=8, duration=6.0, load=2.0, prompt=128, max_tokens=32, prefill_rate=20000.0,
        itl_base_ms=5.0, itl_slope_ms=0.05, blocks=65536, queue_max=256, queue_timeout=30.0,
        headroom=2, output_cap=1024, deadline_ms=300.0, seed=1, critical_share=0.05,
    )  # fmt: skip


def test_a_flood_refuses_the_light_key_without_the_queue_and_never_with_it(args: argparse.Namespace) -> None:
    cap = fb.capacity(args)
    flows = [fb.Flow("A", args.load * cap), fb.Flow("B", args.load * cap / 10)]
    with_queue = fb.summary(fb.replay(args, flows, True), "B", 1.0, args.duration)
    without = fb.summary(fb.replay(args, flows, False), "B", 1.0, args.duration)
    assert with_queue["n"] > 10 and with_queue["refused"] == 0
    assert without["refused"] > with_queue["n"] / 4


@pytest.mark.parametrize("weight", [1.0, 2.0])
def test_over_demanding_keys_split_the_tokens_by_weight(args: argparse.Namespace, weight: float) -> None:
    cap = fb.capacity(args)
    jobs = fb.replay(
        args, [fb.Flow("A", args.load * cap, weight=weight), fb.Flow("B", args.load * cap)], True
    )
    a, b = (fb.summary(jobs, k, 1.0, args.duration)["tokens"] for k in "AB")
    assert a / (a + b) == pytest.approx(weight / (weight + 1.0), abs=0.05)


def test_every_deadline_refusal_is_answered_before_the_deadline(args: argparse.Namespace) -> None:
    flows = [fb.Flow("A", args.load * fb.capacity(args), deadline_ms=args.deadline_ms)]
    jobs = fb.replay(args, flows, True)
    shed = [j for j in jobs if j.outcome == "deadline"]
    assert shed and all(j.answered is not None and j.answered - j.t < args.deadline_ms / 1000.0 for j in shed)


def test_the_report_runs() -> None:
    argv = ["--sims", "2", "--cap", "4", "--duration", "2", "--scenarios", "share,deadline"]
    out = subprocess.run(
        [sys.executable, "-m", "bench.fleet.fairness", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert "share     queue" in out and "deadline  no queue" in out


def test_engine_priority_puts_a_critical_request_ahead_of_a_sheddable_flood_in_the_engine_queue(
    args: argparse.Namespace,
) -> None:
    """Sims running fewer requests than the router lets in (``--max-num-seqs`` under ``--cap``):
    the flood waits in their own queues, where first come, first served puts the critical key
    behind it and ``--scheduling-policy priority`` (the tier sent as ``priority``) ahead."""
    cap = fb.capacity(args)
    flows = [fb.Flow("S", args.load * cap, tier=-1), fb.Flow("C", cap * 0.05, tier=1)]
    ttft = {}
    for engine_priority in (False, True):
        a = argparse.Namespace(
            **{**vars(args), "cap": 12, "max_num_seqs": 8, "engine_priority": engine_priority}
        )
        ttft[engine_priority] = fb.summary(fb.replay(a, flows, True), "C", 1.0, args.duration)["ttft_p90"]
    assert ttft[True] < ttft[False] / 2, ttft


@pytest.mark.slow
def test_at_the_bench_size_a_flooded_light_key_keeps_its_ttft_within_1_5x_of_alone() -> None:
    """The Done-when row at the bench's own size (4 sims × cap 16, 20 virtual seconds)."""
    a = argparse.Namespace(
        sims=4, cap=16, duration=20.0, load=2.0, prompt=128, max_tokens=64, prefill_rate=20000.0,
        itl_base_ms=5.0, itl_slope_ms=0.05, blocks=65536, queue_max=1024, queue_timeout=30.0,
        headroom=2, output_cap=1024, deadline_ms=500.0, seed=0, critical_share=0.05,
    )  # fmt: skip
    cap = fb.capacity(a)
    light = fb.Flow("B", a.load * cap / 10)
    _, report, ok = fb.beside_alone(a, [fb.Flow("A", a.load * cap), light], light, True, 1.5)
    assert ok, report


def test_the_tier_guard_keeps_a_critical_key_within_1_2x_of_alone_under_a_sheddable_flood(
    args: argparse.Namespace,
) -> None:
    """``--tier-window``: while critical requests arrive, the sheddable flood keeps to half of
    the sims and off those running a critical request, so a critical request finds a quiet sim;
    without it the critical key's TTFT p90 is far over 1.2× of alone (a slot, not a quiet sim)."""
    cap = fb.capacity(args)
    critical = fb.Flow("C", cap * args.critical_share, tier=1)
    flows = [fb.Flow("S", args.load * cap, tier=-1), critical]
    ok = {}
    for window in (0.0, 1.0):
        a = argparse.Namespace(**{**vars(args), "tier_window": window, "tier_share": 0.5})
        _, report, ok[window] = fb.beside_alone(a, flows, critical, True, 1.2)
    assert ok == {0.0: False, 1.0: True}, report


def test_a_sheddable_key_alone_keeps_the_whole_fleet_under_the_tier_guard(args: argparse.Namespace) -> None:
    """No higher tier seen: the guard holds nothing back (the same tokens served as without)."""
    flows = [fb.Flow("S", args.load * fb.capacity(args), tier=-1)]
    served = []
    for window in (0.0, 1.0):
        a = argparse.Namespace(**{**vars(args), "tier_window": window, "tier_share": 0.5})
        served.append(fb.summary(fb.replay(a, flows, True), "S", 1.0, args.duration)["tokens"])
    assert served[0] == served[1] > 0

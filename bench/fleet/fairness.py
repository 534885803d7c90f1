"""Many tenants on a saturated fleet: the router queue's fairness, tiers and deadlines.

A discrete-event replay in virtual time (like ``bench/fleet/saturation.py``): ``--sims`` real
:class:`infera_sim.engine.SimEngine` instances (their scheduler and timing model) stepped on
one clock, behind a router with ``--cap`` requests in flight per sim (``--max-inflight-per-worker``).
Requests arrive per key as Poisson streams of random (uncached) prompts; output lengths are
exponential around ``--max-tokens`` (capped at 4×), as in real traces. With the queue, a
request no sim can take waits in the router's own :class:`~infera_core.scheduling.fairqueue.FairQueue`
(the server's code: tiers, start-time fair queuing, eviction, the deadline estimate, the
expiry timers) and is dispatched when a slot frees; without it, it is refused at once (what
the router did before the queue, so without ``--headroom`` either). Scenarios (each with and
without the queue):

* ``flood`` — key A sends 10× key B's rate at equal weight (A alone over-demands the fleet);
  B's refusals and TTFT p90 against B alone on the same fleet;
* ``share`` / ``share-2:1`` — A and B both over-demand: the tokens each is served (50/50;
  with weights 2:1, 67/33);
* ``critical`` — a critical key under a sheddable flood against the critical key alone;

``--headroom`` (the server's ``--queue-headroom``) keeps slots of each sim from sheddable
requests and from keys holding their fair share of the fleet's slots or more.
``--tier-window`` (with the queue; 1 s by default, 0: off): while a higher tier was dispatched in the last window,
lower tiers keep to ``--tier-share`` of the sims and off those running a higher tier
(:class:`~infera_core.scheduling.tierguard.TierGuard`), so a critical request finds a quiet
sim: the ``critical`` row holds (≤ 1.2×) with ``--tier-window 1 --tier-share 0.5``. The
sim's step adds the decode step's cost (``itl_base_ms``) to a step that also prefills, so a
critical prefill next to any decode pays both; a real engine runs the two in one forward pass
and reads the weights once, so this overstates what a busy batch costs a critical request.
* ``deadline`` — A floods with a TTFT deadline on every request: each refused one must be
  answered before its deadline.

    .venv/bin/python -m bench.fleet.fairness [--sims 4] [--cap 16] [--duration 60] [--scenarios ...]

Capacity: a sim at its cap serves about ``cap / (prompt / prefill_rate + max_tokens × ITL(cap))``
requests per second; ``--load`` is the flooding key's demand in multiples of the fleet's.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
from dataclasses import dataclass, field

from infera_sim.config import SimConfig
from infera_sim.engine import SimEngine
from infera_sim.request import SimRequest
from infera_sim.tokenizer import SimTokenizer

from infera_core.scheduling.fairqueue import FairQueue, Shares, Waiter, engine_priority, request_cost, tier_of
from infera_core.scheduling.tierguard import TierGuard
from infera_core.worker import PriorityOrder


@dataclass(slots=True)
class Flow:
    key: str
    rate: float
    """Requests per virtual second."""
    tier: int = 0
    weight: float = 1.0
    deadline_ms: float | None = None


@dataclass(slots=True, eq=False)
class Job:
    key: str
    tier: int
    weight: float
    t: float
    prompt: list[int]
    max_tokens: int
    deadline_ms: float | None
    outcome: str = ""
    """``served``, or the refusal's reason (``refused`` without the queue)."""
    answered: float | None = None
    ttft: float | None = None
    tokens: int = 0
    done_at: float = 0.0


def make_jobs(flows: list[Flow], duration: float, prompt_len: int, max_tokens: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    jobs = []
    for f in flows:
        t = rng.expovariate(f.rate)
        while t < duration:
            prompt = [rng.randrange(10, 30000) for _ in range(prompt_len)]  # unique: nothing cached
            out = max(1, min(4 * max_tokens, round(rng.expovariate(1.0 / max_tokens))))  # mean max_tokens
            jobs.append(Job(f.key, f.tier, f.weight, t, prompt, out, f.deadline_ms))
            t += rng.expovariate(f.rate)
    jobs.sort(key=lambda j: j.t)
    return jobs


@dataclass
class Replay:
    """One run: the fleet, the router's slots and (``queued``) its fair queue."""

    args: argparse.Namespace
    queued: bool
    engines: list[SimEngine] = field(default_factory=list)
    in_flight: list[int] = field(default_factory=list)
    events: list[tuple[float, int, str, object]] = field(default_factory=list)
    owner: dict[str, tuple[int, Job, SimRequest]] = field(default_factory=dict)
    seq: int = 0

    def __post_init__(self) -> None:
        a = self.args
        tok = SimTokenizer()
        for _ in range(a.sims):
            cfg = SimConfig(
                block_size=16,
                cache_blocks=a.blocks,
                max_model_len=1 << 20,
                prefill_tokens_per_s=a.prefill_rate,
                itl_base_ms=a.itl_base_ms,
                itl_slope_ms=a.itl_slope_ms,
                max_num_seqs=getattr(a, "max_num_seqs", 256),
                scheduling_policy="priority" if getattr(a, "engine_priority", False) else "fcfs",
            )
            self.engines.append(SimEngine(cfg, tok, publish=None))
        self.in_flight = [0] * a.sims
        self.plans: list[object] = [None] * a.sims
        self.busy = [False] * a.sims
        self.queue = FairQueue(a.queue_max)
        self.shares = Shares()
        self.guard = TierGuard(getattr(a, "tier_window", 0.0), getattr(a, "tier_share", 0.5))
        self.names = [f"sim{i}" for i in range(a.sims)]
        self.now = 0.0

    def _at(self, t: float, kind: str, data: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, data))

    # -- the router ----------------------------------------------------------------------
    def pick(self, job: Job) -> int | None:
        """The least loaded sim under its cap, as ``--queue-headroom`` has it: a sheddable
        request, or one of a key holding its fair share of the slots, leaves the headroom free."""
        a, cap = self.args, self.args.cap
        held_back = job.tier < 0 or self.shares.over(job.key, job.weight, a.sims * a.cap, self.queue)
        if self.queued and a.headroom and held_back:
            cap = max(1, cap - a.headroom)
        sims: list[int] = list(range(len(self.in_flight)))
        if self.queued and self.guard.window:  # --tier-window: the router queue's TierGuard
            avoid = self.guard.avoid(job.tier, self.names, self.now)
            sims = [i for i in sims if self.names[i] not in avoid]
            if not sims:
                return None
        best = min(sims, key=self.in_flight.__getitem__)
        return best if self.in_flight[best] < cap else None

    def arrive(self, job: Job, now: float) -> None:
        q = self.queue
        if not self.queued or not len(q):
            i = self.pick(job)
            if i is not None:
                self.dispatch(job, i, now)
                return
            if not self.queued:
                self.refuse(job, "refused", now)
                return
        cost = request_cost(len(job.prompt), 0, job.max_tokens, self.args.output_cap)
        deadline = job.t + job.deadline_ms / 1000.0 if job.deadline_ms is not None else None
        w = Waiter(job.key, job.tier, cost, now, deadline, job.weight, job)
        refused, evicted = q.offer(w, now)
        if evicted is not None:
            self.refuse(evicted[0].payload, evicted[1], now)
        if refused is not None:
            self.refuse(job, refused, now)
            return
        self.pump(now)
        if w.queued:
            delay, reason = q.expiry(w, self.args.queue_timeout, now)
            self._at(now + delay, "expire", (w, reason))

    def expire(self, w: Waiter, reason: str, now: float) -> None:
        if self.queue.remove(w):
            self.refuse(w.payload, reason, now)

    def pump(self, now: float) -> None:
        def place(w: Waiter) -> bool:
            i = self.pick(w.payload)
            if i is None:
                return False
            self.dispatch(w.payload, i, now)
            return True

        self.queue.serve(now, place)

    def refuse(self, job: Job, reason: str, now: float) -> None:
        job.outcome, job.answered = reason, now

    # -- the fleet (as bench/fleet/saturation.py steps it) -----------------------------------
    def dispatch(self, job: Job, i: int, now: float) -> None:
        self.in_flight[i] += 1
        self.shares.started(job.key, job.weight)
        self.guard.started(self.names[i], job.tier, now)
        rid = f"r{self.seq}-{id(job)}"
        priority = 0
        if getattr(self.args, "engine_priority", False):  # what the router sends a priority worker
            priority = engine_priority(job.tier, PriorityOrder.LOWER_FIRST)
        req = SimRequest(rid, job.prompt, job.max_tokens, ignore_eos=True, priority=priority)
        req.stream = False
        eng = self.engines[i]
        eng.sim_time = max(eng.sim_time, now)
        eng.add(req)
        self.owner[rid] = (i, job, req)
        if not self.busy[i]:
            self.start_step(i, now)

    def start_step(self, i: int, now: float) -> None:
        eng = self.engines[i]
        eng.sim_time = max(eng.sim_time, now)
        plan, duration = eng._plan()
        self.busy[i] = bool(plan)
        if plan:
            self.plans[i] = plan
            self._at(eng.sim_time + duration, "step", i)

    def end_step(self, i: int, t: float) -> None:
        eng = self.engines[i]
        eng.sim_time = t
        plan = self.plans[i]
        eng._execute(plan, t)  # type: ignore[arg-type]
        eng._flush_events()
        freed = False
        for r, _ in plan:  # type: ignore[attr-defined]
            if r.done and r.request_id in self.owner:
                _, job, req = self.owner.pop(r.request_id)
                job.outcome, job.done_at = "served", t
                job.ttft = (req.first_token_at or t) - job.t
                job.tokens = len(req.prompt) + req.num_generated
                self.in_flight[i] -= 1
                self.shares.ended(job.key)
                self.guard.ended(self.names[i], job.tier)
                freed = True
        self.start_step(i, t)
        if freed and self.queued:
            self.pump(t)

    def run(self, jobs: list[Job]) -> list[Job]:
        for job in jobs:
            self._at(job.t, "arrive", job)
        while self.events:
            t, _, kind, data = heapq.heappop(self.events)
            self.now = t
            if kind == "arrive":
                self.arrive(data, t)  # type: ignore[arg-type]
            elif kind == "step":
                self.end_step(data, t)  # type: ignore[arg-type]
            else:
                w, reason = data  # type: ignore[misc]
                self.expire(w, reason, t)
        return jobs


# -- the report ----------------------------------------------------------------------------------
def p90(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=10)[8]


def summary(jobs: list[Job], key: str, warm: float, end: float) -> dict[str, float]:
    mine = [j for j in jobs if j.key == key and warm <= j.t < end]
    served = [j for j in mine if j.outcome == "served"]
    return {
        "n": len(mine),
        "refused": sum(1 for j in mine if j.outcome != "served"),
        "ttft_p90": p90([j.ttft for j in served if j.ttft is not None]),
        "tokens": float(
            sum(j.tokens for j in jobs if j.key == key and j.outcome == "served" and warm <= j.done_at < end)
        ),
    }


def capacity(a: argparse.Namespace) -> float:
    """Requests per second the fleet serves at its cap."""
    service = a.prompt / a.prefill_rate + a.max_tokens * (a.itl_base_ms + a.itl_slope_ms * a.cap) / 1000.0
    return a.sims * a.cap / service


def replay(a: argparse.Namespace, flows: list[Flow], queued: bool) -> list[Job]:
    jobs = make_jobs(flows, a.duration, a.prompt, a.max_tokens, a.seed)
    return Replay(a, queued).run(jobs)


def beside_alone(
    a: argparse.Namespace, flows: list[Flow], mine: Flow, queued: bool, bound: float
) -> tuple[list[Job], str, bool]:
    """Replay ``flows`` (``mine`` among them) and ``mine`` alone: (the jobs of ``flows``, how
    ``mine``'s key fared beside the others and alone up to its TTFT ratio, whether none of its
    requests was refused and its TTFT p90 stayed within ``bound`` × the one alone)."""
    warm, end = a.duration * 0.2, a.duration
    both, solo = replay(a, flows, queued), replay(a, [mine], queued)
    got, alone = summary(both, mine.key, warm, end), summary(solo, mine.key, warm, end)
    ratio = got["ttft_p90"] / alone["ttft_p90"]
    report = (
        f"{mine.key} refused {got['refused']:.0f}/{got['n']:.0f}, {mine.key} TTFT p90 {got['ttft_p90'] * 1e3:7.1f} ms"
        f" vs alone {alone['ttft_p90'] * 1e3:6.1f} ms ({ratio:.2f}×"
    )
    return both, report, got["refused"] == 0 and ratio <= bound


def scenario(a: argparse.Namespace, name: str) -> list[str]:
    cap = capacity(a)
    warm, end = a.duration * 0.2, a.duration
    lines = []
    for queued in (True, False):
        mode = "queue" if queued else "no queue"
        if name == "flood":
            light = Flow("B", a.load * cap / 10.0)
            both, report, ok = beside_alone(a, [Flow("A", a.load * cap), light], light, queued, 1.5)
            lines.append(
                f"flood     {mode:<9} {report}; A refused "
                f"{summary(both, 'A', warm, end)['refused']:.0f})  {'PASS' if ok else 'FAIL'} (0 refused, ≤ 1.5×)"
            )
        elif name.startswith("share"):
            wa = 2.0 if name == "share-2:1" else 1.0
            flows = [Flow("A", a.load * cap, weight=wa), Flow("B", a.load * cap)]
            jobs = replay(a, flows, queued)
            ta, tb = summary(jobs, "A", warm, end)["tokens"], summary(jobs, "B", warm, end)["tokens"]
            share = ta / max(1.0, ta + tb)
            want = wa / (wa + 1.0)
            ok = abs(share - want) <= 0.05
            lines.append(
                f"{name:<9} {mode:<9} A {share:6.1%} / B {1 - share:6.1%} of the tokens (want {want:.0%} ± 5)"
                f"  {'PASS' if ok else 'FAIL'}"
            )
        elif name == "critical":
            critical = Flow("C", cap * a.critical_share, tier=tier_of("critical"))
            flows = [Flow("S", a.load * cap, tier=tier_of("sheddable")), critical]
            runs = [(a, mode)]
            if queued and a.tier_window:  # the queue without the tier guard beside it
                runs.append((argparse.Namespace(**{**vars(a), "tier_window": 0.0}), "queue, no tier guard"))
            for ra, label in runs:
                _, report, ok = beside_alone(ra, flows, critical, queued, 1.2)
                lines.append(f"critical  {label:<9} {report})  {'PASS' if ok else 'FAIL'} (≤ 1.2×)")
        elif name == "deadline":
            flows = [Flow("A", a.load * cap, deadline_ms=a.deadline_ms)]
            jobs = replay(a, flows, queued)
            shed = [j for j in jobs if j.outcome not in ("served", "")]
            late = [j for j in shed if j.answered is not None and j.answered - j.t >= a.deadline_ms / 1000.0]
            served = [j for j in jobs if j.outcome == "served" and j.ttft is not None]
            met = sum(1 for j in served if j.ttft is not None and j.ttft * 1000.0 <= a.deadline_ms)
            reasons = sorted({j.outcome for j in shed})
            lines.append(
                f"deadline  {mode:<9} {len(shed)} refused ({', '.join(reasons)}), {len(late)} answered after their "
                f"deadline; served {len(served)}, {met} within it  {'PASS' if not late else 'FAIL'}"
            )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=4)
    ap.add_argument(
        "--cap", type=int, default=16, help="requests in flight per sim (--max-inflight-per-worker)"
    )
    ap.add_argument("--duration", type=float, default=60.0, help="virtual seconds of arrivals")
    ap.add_argument(
        "--load", type=float, default=2.0, help="the flooding key's demand / the fleet's capacity"
    )
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per request")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prefill-rate", type=float, default=20000.0)
    ap.add_argument("--itl-base-ms", type=float, default=5.0)
    ap.add_argument("--itl-slope-ms", type=float, default=0.05)
    ap.add_argument("--blocks", type=int, default=65536, help="KV blocks per sim")
    ap.add_argument(
        "--max-num-seqs",
        type=int,
        default=256,
        help="requests a sim runs at once (the rest wait in its own queue: set it under --cap)",
    )
    ap.add_argument(
        "--engine-priority",
        action="store_true",
        help="sims schedule their waiting queue by priority (--scheduling-policy priority) and each"
        " request carries its tier as the engine's priority, as the router sends it",
    )
    ap.add_argument("--queue-max", type=int, default=1024)
    ap.add_argument("--queue-timeout", type=float, default=30.0)
    ap.add_argument(
        "--headroom",
        type=int,
        default=2,
        help="slots per sim that sheddable requests and keys over their fair share leave free (--queue-headroom)",
    )
    ap.add_argument(
        "--tier-window",
        type=float,
        default=1.0,
        help="with the queue: while a higher tier was dispatched in the last this many seconds, lower"
        " tiers keep to --tier-share of the sims and off those running a higher tier (the server's"
        " --queue-tier-window; 0: off)",
    )
    ap.add_argument(
        "--tier-share",
        type=float,
        default=0.5,
        help="the part of the sims a lower tier keeps to while a higher one is active (--queue-tier-share)",
    )
    ap.add_argument("--output-cap", type=int, default=1024)
    ap.add_argument("--deadline-ms", type=float, default=500.0)
    ap.add_argument(
        "--critical-share", type=float, default=0.05, help="the critical key's demand / the fleet's capacity"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scenarios", default="flood,share,share-2:1,critical,deadline")
    a = ap.parse_args()
    print(
        f"{a.sims} sims × cap {a.cap}: about {capacity(a):.0f} requests/s; the flood demands {a.load:g}× that; "
        f"{a.prompt}-token prompts, {a.max_tokens} output tokens, {a.duration:g} s virtual (first 20 % not counted)"
    )
    for name in a.scenarios.split(","):
        for line in scenario(a, name):
            print(line, flush=True)


if __name__ == "__main__":
    main()

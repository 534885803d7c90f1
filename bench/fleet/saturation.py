"""Routing under saturation: cache affinity against load balance, on a fleet near capacity.

A discrete-event replay (virtual time, so far faster than real time and without sockets):
``--sims`` real :class:`infera_sim.engine.SimEngine` instances (their scheduler, prefix cache
with LRU eviction, KV events and timing model: ``prefill_tokens_per_s``, ITL) are stepped on one
virtual clock; requests from a Mooncake trace (``--trace``, default the one in ``bench/data/``)
arrive at their timestamps divided by ``--speedup`` and are routed by the router's real profiles
(``kv-aware``, ``round-robin``, ``least-load``…), by sglang-router's ``cache_aware``
re-implemented (``sglang-cache-aware``, ``bench/fleet/sglang_cache_aware.py``) or by the
kv-aware preset as it was before the saturation work (``kv-aware-before``), over
:class:`Endpoint` objects whose in-flight counts follow the requests, with a real
:class:`KvIndex` fed every sim's KV events as they are emitted. Trace blocks (512 tokens each)
are scaled to ``--tokens-per-block`` tokens so a 2048-block sim holds a useful share of the
working set.

Reports per policy: TTFT p50/p90/p99 (virtual seconds), the prefix-cache hit fraction
(cached prompt tokens / prompt tokens, summed over the sims), and that fraction over the
*pooled bound*: one LRU cache the size of the whole fleet fed the same requests in order;
the blocks running requests held (mean at arrivals) and the hit over the same bound for the
blocks they left free.

    .venv/bin/python -m bench.fleet.saturation [--rows 3000] [--skip 0] [--speedup 8] [--sims 8]
        [--blocks 2048] [--policies kv-aware,kv-aware-before,sglang-cache-aware,round-robin,least-load]
        [--event-lag 0] [--pooled-sim]

``--event-lag S`` delays every KV event batch by S virtual seconds on its way to the index
(an event plane that lags: JetStream on a loaded host); ``kv-aware-no-linger`` is
``kv-aware`` whose credit for a prompt it sent ends with the request.
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
import time
from collections import OrderedDict
from dataclasses import dataclass

from infera_policies.basic import register_basic
from infera_policies.kv import kv_profile, register_kv
from infera_policies.predicted import register_predicted
from infera_sim.config import SimConfig
from infera_sim.engine import SimEngine
from infera_sim.kvcache import block_hashes
from infera_sim.request import SimRequest
from infera_sim.tokenizer import SimTokenizer

from bench.fleet.sglang_cache_aware import CacheAware
from bench.traces import MOONCAKE_TRACE
from infera_core.bench.trace import BlockTokens
from infera_core.kv.events import KvEvent, KvEventBatch
from infera_core.kv.index import KvIndex
from infera_core.request import RequestContext
from infera_core.scheduling.config import ProfileConfig
from infera_core.scheduling.profile import build_profile
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.types import Endpoint, SchedulerDeps
from infera_core.testing.policies import kv_worker_record, policy_registry

BS = 16
BEFORE = "kv-aware-before"
SGLANG = "sglang-cache-aware"
"""sglang-router's ``cache_aware`` (defaults), re-implemented in ``bench/fleet/sglang_cache_aware.py``."""
NO_LINGER = "kv-aware-no-linger"
"""``kv-aware`` whose in-flight credit ends with the request (``kv-overlap``'s ``linger`` 0)."""


@dataclass(slots=True)
class Arrival:
    t: float
    prompt: list[int]
    max_tokens: int


def load_trace(
    path: str, rows: int, speedup: float, tokens_per_block: int, output_div: int, skip: int = 0
) -> list[Arrival]:
    blocks = BlockTokens(seed=0, block_tokens=tokens_per_block)
    out = []
    t0: float | None = None
    with open(path) as f:
        for i, line in enumerate(f):
            if i < skip:
                continue
            if i >= skip + rows:
                break
            row = json.loads(line)
            if t0 is None:
                t0 = row["timestamp"]
            length = max(1, row["input_length"] * tokens_per_block // 512)
            prompt = blocks.prompt(row["hash_ids"], length, i)
            out.append(
                Arrival(
                    (row["timestamp"] - t0) / 1000.0 / speedup,
                    prompt,
                    max(1, row["output_length"] // output_div),
                )
            )
    return out


def pooled_bound(arrivals: list[Arrival], capacity: int) -> float:
    """Hit fraction of one LRU of ``capacity`` blocks fed every request (the sim's match rule)."""
    lru: OrderedDict[int, None] = OrderedDict()
    hit = total = 0
    for a in arrivals:
        hashes = block_hashes(a.prompt, BS)
        usable = (len(a.prompt) - 1) // BS
        n = 0
        for h in hashes[:usable]:
            if h not in lru:
                break
            n += 1
        hit += n * BS
        total += len(a.prompt)
        for h in hashes:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > capacity:
            lru.popitem(last=False)
    return hit / total


class Fleet:
    """The sims, their endpoints and the router's KV index, on one virtual clock."""

    def __init__(
        self, sims: int, blocks: int, cfg_over: dict[str, float], lag: float = 0.0, fast: float = 1.0
    ) -> None:
        self.index = KvIndex()
        self.lag = lag
        self.late: list[tuple[float, int, object, KvEventBatch]] = []
        """KV event batches on their way to the index: (when they arrive, order, view, batch)."""
        self.engines: list[SimEngine] = []
        self.endpoints: list[Endpoint] = []
        self.views = []
        tok = SimTokenizer()
        for i in range(sims):
            over = dict(cfg_over)
            if fast != 1.0 and i % 2:  # a heterogeneous fleet: every other sim prefills ``fast`` × faster
                over["prefill_tokens_per_s"] = over["prefill_tokens_per_s"] * fast
            cfg = SimConfig(cache_blocks=blocks, block_size=BS, max_model_len=1 << 20, **over)  # type: ignore[arg-type]
            view = self.index.add_view(f"sim{i}", None, BS)
            self.views.append(view)
            eng = SimEngine(cfg, tok, publish=self._publisher(view))
            self.engines.append(eng)
            self.endpoints.append(Endpoint(kv_worker_record(f"sim{i}", BS)))

    def _publisher(self, view: object):  # type: ignore[no-untyped-def]
        index = self.index

        def publish(ts: float, events: list[KvEvent]) -> None:
            if self.lag:
                heapq.heappush(self.late, (ts + self.lag, len(self.late), view, KvEventBatch(ts, events)))
            else:
                index.apply(view, KvEventBatch(ts, events))  # type: ignore[arg-type]

        return publish

    def deliver(self, now: float) -> None:
        """Index the event batches that arrived by ``now`` (``--event-lag``)."""
        late = self.late
        while late and late[0][0] <= now:
            _, _, view, batch = heapq.heappop(late)
            self.index.apply(view, batch)  # type: ignore[arg-type]


def run(
    policy: str, arrivals: list[Arrival], args: argparse.Namespace, reg: PolicyRegistry, pooled: bool = False
) -> dict[str, float]:
    """Replay ``arrivals`` on the fleet under ``policy``; ``pooled``: on one sim with the whole fleet's
    cache, prefill rate, batch budget and sequence slots instead (the sim-pooled bound)."""
    n = args.sims
    cfg: dict[str, float] = {"prefill_tokens_per_s": args.prefill_rate * (n if pooled else 1)}
    if pooled:
        cfg |= {"max_num_seqs": 256 * n, "max_num_batched_tokens": 8192 * n}
    fleet = Fleet(
        1 if pooled else n,
        args.blocks * (n if pooled else 1),
        cfg,
        args.event_lag,
        getattr(args, "fast", 1.0),
    )
    clock = [0.0]  # virtual time, for the policies' clocks (approximate-prefix's TTL, kv-overlap's linger)
    deps = SchedulerDeps(kv_index=fleet.index, clock=lambda: clock[0])
    sglang = CacheAware([ep.worker_id for ep in fleet.endpoints]) if policy == SGLANG else None
    profile = build_profile(policy, profile_config("round-robin" if sglang else policy, reg), reg, deps)
    names = [ep.worker_id for ep in fleet.endpoints]
    engines, endpoints = fleet.engines, fleet.endpoints
    step_end: list[float | None] = [None] * len(engines)
    plans: list[object] = [None] * len(engines)
    owner: dict[str, tuple[int, RequestContext, SimRequest]] = {}
    heap: list[tuple[float, int]] = []  # (step end, sim)
    ttft: list[float] = []
    decide: list[float] = []
    cached = [0, 0]  # prompt tokens found cached at admission, prompt tokens
    held: list[int] = []  # blocks referenced by running requests, at each arrival
    first_seen: set[str] = set()
    fast_tokens = [0, 0]  # prefill (uncached) tokens on the odd sims (the fast ones with --fast), on all

    def start_step(i: int, now: float) -> None:
        eng = engines[i]
        eng.sim_time = max(eng.sim_time, now)
        plan, duration = eng._plan()
        if plan:
            plans[i] = plan
            step_end[i] = eng.sim_time + duration
            heapq.heappush(heap, (eng.sim_time + duration, i))
        else:
            step_end[i] = None

    def end_step(i: int, t: float) -> None:
        eng = engines[i]
        eng.sim_time = t
        plan = plans[i]
        eng._execute(plan, t)  # type: ignore[arg-type]
        eng._flush_events()
        for r, _ in plan:  # type: ignore[attr-defined]
            if r.request_id not in owner:
                continue
            _, ctx, req = owner[r.request_id]
            if req.first_token_at is not None and r.request_id not in first_seen:
                first_seen.add(r.request_id)  # what the router sees of a stream: its first token
                profile.first_token(ctx, endpoints[i])
            if r.done:
                del owner[r.request_id]
                first_seen.discard(r.request_id)
                ttft.append((req.first_token_at or t) - req.arrival)
                cached[0] += req.num_cached
                cached[1] += len(req.prompt)
                gen = max(1, req.num_generated)
                if gen > 1 and req.first_token_at is not None:
                    profile.timing(
                        ctx, endpoints[i], t - req.first_token_at, (t - req.first_token_at) / (gen - 1)
                    )
                endpoints[i].in_flight -= 1
                profile.finished(ctx, endpoints[i], True)
                if i % 2:
                    fast_tokens[0] += len(req.prompt) - req.num_cached
                fast_tokens[1] += len(req.prompt) - req.num_cached
        start_step(i, t)

    k = 0
    while k < len(arrivals) or heap:
        t_arr = arrivals[k].t if k < len(arrivals) else float("inf")
        if heap and heap[0][0] <= t_arr:
            t, i = heapq.heappop(heap)
            clock[0] = t
            fleet.deliver(t)
            end_step(i, t)
            continue
        a = arrivals[k]
        clock[0] = a.t
        fleet.deliver(a.t)
        held.append(sum(e.cache.used for e in engines))
        rid = f"r{k}"
        k += 1
        ctx = RequestContext(rid, "m", "/v1/completions", {"prompt": ""}, token_ids=a.prompt)
        t0 = time.perf_counter()
        if sglang is not None:
            i = sglang.pick(a.prompt, names, [e.in_flight for e in endpoints], a.t)
            ep = endpoints[i]
        else:
            ep = profile.pick(ctx, profile.filter(ctx, endpoints))
            i = endpoints.index(ep)
        decide.append(time.perf_counter() - t0)
        ep.in_flight += 1
        req = SimRequest(rid, a.prompt, a.max_tokens, ignore_eos=True)
        req.stream = False
        eng = engines[i]
        eng.sim_time = max(eng.sim_time, a.t)
        eng.add(req)
        owner[rid] = (i, ctx, req)
        if step_end[i] is None:
            start_step(i, a.t)
    q = statistics.quantiles(ttft, n=100)
    spread = [e.metrics.prompt_tokens for e in engines]
    return {
        "ttft_p50": q[49],
        "ttft_p90": q[89],
        "ttft_p99": q[98],
        "hit": cached[0] / max(1, cached[1]),
        "imbalance": max(spread) / max(1.0, statistics.fmean(spread)),
        "preemptions": float(sum(e.metrics.preemptions for e in engines)),
        "decide_us": statistics.fmean(decide) * 1e6,
        "held": statistics.fmean(held),
        "mae": deps.latency.mae if deps.latency.mae is not None else float("nan"),
        "fast_share": fast_tokens[0] / max(1, fast_tokens[1]),
    }


def profile_config(policy: str, reg: PolicyRegistry) -> ProfileConfig:
    """A preset by name, ``kv-aware-before`` (the preset before this bench's tuning), or
    ``kv:OVERLAP/LOAD/RECENT/FACTOR[/GAP[/FILL]]`` for a kv-aware variant (tuning)."""
    if policy == BEFORE:
        cfg = kv_profile(1.0, 0.1, 0.05, 1.2, 16.0)
        cfg.scorers[0].params = {"pending": False}
        return cfg
    if policy == NO_LINGER:
        cfg = reg.preset("kv-aware").profile.model_copy(deep=True)
        cfg.scorers[0].params = {"linger": 0}
        return cfg
    if policy.startswith("kv:"):
        o, load, recent, guard, *rest = (float(x) for x in policy[3:].split("/"))
        gap = rest[0] if rest else 8.0
        return kv_profile(o, load, recent, guard, gap, fill=rest[1] if len(rest) > 1 else 0.0)
    return reg.preset(policy).profile


def registry() -> PolicyRegistry:
    return policy_registry(register_basic, register_kv, register_predicted)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--trace", default=str(MOONCAKE_TRACE), help="a Mooncake JSONL trace (default: the shipped one)"
    )
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--skip", type=int, default=0, help="start at this row of the trace (a held-out part)")
    ap.add_argument("--speedup", type=float, default=8.0, help="trace time / replay time")
    ap.add_argument("--sims", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=2048, help="KV cache blocks per sim (16 tokens each)")
    ap.add_argument("--tokens-per-block", type=int, default=32, help="tokens per 512-token trace block")
    ap.add_argument("--output-div", type=int, default=4, help="divide output lengths by this")
    ap.add_argument("--prefill-rate", type=float, default=20000.0, help="sim prefill tokens/s")
    ap.add_argument(
        "--fast",
        type=float,
        default=1.0,
        help="every other sim prefills this many times faster (heterogeneous)",
    )
    ap.add_argument(
        "--policies",
        default=f"kv-aware,{BEFORE},{SGLANG},round-robin,least-load",
        help=f"presets, {BEFORE}, {NO_LINGER}, {SGLANG} (sglang-router's cache_aware), or "
        "kv:OVERLAP/LOAD/RECENT/GUARD-FACTOR[/GAP[/FILL]] for a kv-aware variant",
    )
    ap.add_argument(
        "--event-lag",
        type=float,
        default=0.0,
        help="virtual seconds between a sim emitting KV events and the router indexing them",
    )
    ap.add_argument(
        "--pooled-sim",
        action="store_true",
        help="also replay on one sim with the whole fleet's cache, prefill rate, batch budget and slots",
    )
    a = ap.parse_args()
    arrivals = load_trace(a.trace, a.rows, a.speedup, a.tokens_per_block, a.output_div, a.skip)
    bound = pooled_bound(arrivals, a.sims * a.blocks)
    span = arrivals[-1].t - arrivals[0].t
    offered = sum(len(x.prompt) for x in arrivals) / max(span, 1e-9) / (a.sims * a.prefill_rate)
    print(
        f"{len(arrivals)} requests over {span:.0f} s (virtual), {a.sims} sims × {a.blocks} blocks; "
        f"uncached prefill load {offered:.2f}× the fleet's prefill rate; pooled-LRU bound hit {bound:.3f}"
    )
    print(
        f"{'policy':<18} {'TTFT p50':>9} {'p90':>8} {'p99':>8} {'hit':>6} {'/bound':>7} "
        f"{'max/mean':>8} {'preempt':>7} {'µs/decision':>11} {'held':>6} {'/free bound':>11} {'fast':>5} {'MAE':>6}"
    )
    reg = registry()
    rows = {}
    for policy in a.policies.split(","):
        r = rows[policy] = run(policy, arrivals, a, reg)
        # the same LRU bound, over the blocks that running requests left free on average
        free = pooled_bound(arrivals, max(1, int(a.sims * a.blocks - r["held"])))
        print(
            f"{policy:<18} {r['ttft_p50']:9.3f} {r['ttft_p90']:8.3f} {r['ttft_p99']:8.3f} {r['hit']:6.3f} "
            f"{r['hit'] / bound:7.3f} {r['imbalance']:8.2f} {r['preemptions']:7.0f} {r['decide_us']:11.0f} "
            f"{r['held']:6.0f} {r['hit'] / free:11.3f} {r['fast_share']:5.2f} {r['mae']:6.3f}",
            flush=True,
        )
    if a.pooled_sim:
        r = run("round-robin", arrivals, a, reg, pooled=True)
        print(
            f"{'(one pooled sim)':<18} {r['ttft_p50']:9.3f} {r['ttft_p90']:8.3f} {r['ttft_p99']:8.3f} {r['hit']:6.3f}"
        )
    print_ratios(rows)


def print_ratios(rows: dict[str, dict[str, float]], sglang_label: str = SGLANG) -> None:
    """kv-aware's TTFT p90 against round-robin's, and its TTFT p90 and hit rate against the
    SGLang router's row (printed as ``sglang_label``), for the rows present."""
    if "kv-aware" in rows and "round-robin" in rows:
        ratio = rows["kv-aware"]["ttft_p90"] / rows["round-robin"]["ttft_p90"]
        print(f"kv-aware TTFT p90 / round-robin's: {ratio:.2f}")
    if "kv-aware" in rows and SGLANG in rows:
        kv, sg = rows["kv-aware"], rows[SGLANG]
        print(
            f"kv-aware / {sglang_label}: TTFT p90 {kv['ttft_p90'] / sg['ttft_p90']:.2f}, "
            f"hit {kv['hit'] / sg['hit']:.2f}"
        )


if __name__ == "__main__":
    main()

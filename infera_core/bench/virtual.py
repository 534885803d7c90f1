"""Replay a workload over a fleet of virtual engines on one virtual clock (``infera-run plan``).

Each worker is an engine adapter's :class:`VirtualEngine` (the sim's real scheduler, prefix cache
and timing model, set by a :class:`TimingProfile`); requests arrive at their trace times and are
routed by the router's real policy profile (a preset such as ``kv-aware``) over
:class:`Endpoint` objects whose in-flight counts follow the requests, with a real
:class:`KvIndex` fed every engine's KV events as they are emitted. Nothing sleeps: an hour of
trace replays in seconds.

With prefill and decode workers (``prefill`` > 0), a request is prefilled on a prefill worker
(one token), its KV moves to a decode worker in ``transfer_s_per_token`` × prompt tokens, and the
decode worker computes only the last prompt token before it decodes; TTFT is taken at the
decode worker's first token, as a client of the router sees it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from infera_core.engines.timing import Finished, Publish, TimingProfile, VirtualEngine, VirtualEngines
from infera_core.kv.events import KvEvent, KvEventBatch
from infera_core.kv.index import KvIndex, WorkerView
from infera_core.request import RequestContext
from infera_core.scheduling.config import ProfileConfig
from infera_core.scheduling.profile import Profile, build_profile
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.types import Endpoint, SchedulerDeps
from infera_core.worker import KvEventsInfo, Role, WorkerRecord

DEFAULT_TRANSFER_S_PER_TOKEN = 131072 * 8 / 100e9
"""KV transfer time per prompt token: the sim's defaults (128 KiB per token over 100 Gbit/s)."""


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request of the workload: when it arrives (s), its prompt token ids, its output length."""

    at: float
    prompt: Sequence[int]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one request saw, in virtual seconds."""

    ttft: float
    tpot: float | None
    """Mean time per output token after the first (None for one-token outputs)."""
    e2e: float
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class FleetShape:
    """A fleet to replay: ``mixed`` workers, or ``prefill`` + ``decode`` workers (PD)."""

    mixed: int = 0
    prefill: int = 0
    decode: int = 0

    @property
    def workers(self) -> int:
        return self.mixed + self.prefill + self.decode

    def label(self) -> str:
        return f"{self.mixed}" if not self.prefill else f"{self.prefill}P+{self.decode}D"


class _Pool:
    """Workers of one role, their endpoints and the routing profile that picks among them."""

    def __init__(
        self,
        role: Role,
        n: int,
        adapter: VirtualEngines,
        timing: TimingProfile,
        cache_blocks: int,
        policy: tuple[str, ProfileConfig],
        registry: PolicyRegistry,
        clock: list[float],
    ) -> None:
        bs = timing.block_size or 16
        self.index = KvIndex()
        self.engines: list[VirtualEngine] = []
        self.endpoints: list[Endpoint] = []
        for i in range(n):
            wid = f"{role.value}{i}"
            view = self.index.add_view(wid, None, bs)
            self.engines.append(adapter.virtual_engine(timing, bs, cache_blocks, self._publisher(view)))
            record = WorkerRecord(
                worker_id=wid,
                url=f"http://{wid}",
                model="m",
                engine="virtual",
                role=Role.MIXED,  # the pool is the role: its profile picks among these alone
                kv_events=KvEventsInfo(endpoint="tcp://virtual:1", format="vllm", block_size=bs),
            )
            self.endpoints.append(Endpoint(record))
        deps = SchedulerDeps(kv_index=self.index, clock=lambda: clock[0])
        self.profile: Profile = build_profile(policy[0], policy[1], registry, deps, where="plan")

    def _publisher(self, view: WorkerView) -> Publish:
        index = self.index

        def publish(ts: float, events: list[KvEvent]) -> None:
            index.apply(view, KvEventBatch(ts, events))

        return publish

    def route(self, ctx: RequestContext) -> int:
        ep = self.profile.pick(ctx, self.profile.filter(ctx, self.endpoints))
        ep.in_flight += 1
        return self.endpoints.index(ep)

    def done(self, ctx: RequestContext, i: int) -> None:
        self.endpoints[i].in_flight -= 1
        self.profile.finished(ctx, self.endpoints[i], True)


class _Flight:
    """A request on its way through the fleet."""

    __slots__ = ("arrived", "cached", "ctx", "k", "worker")

    def __init__(self, k: int, arrived: float) -> None:
        self.k = k
        self.arrived = arrived
        self.worker = 0
        self.ctx: RequestContext | None = None
        self.cached = 0


def replay(
    arrivals: Sequence[Arrival],
    shape: FleetShape,
    adapter: VirtualEngines,
    timing: TimingProfile,
    policy: tuple[str, ProfileConfig],
    registry: PolicyRegistry,
    cache_blocks: int = 4096,
    transfer_s_per_token: float = DEFAULT_TRANSFER_S_PER_TOKEN,
) -> list[Outcome]:
    """Replay ``arrivals`` on a fleet of ``shape``, routed by ``policy`` (name, profile config)."""
    clock = [0.0]
    pd = shape.prefill > 0
    pools: list[_Pool] = []
    if pd:
        pools.append(
            _Pool(Role.PREFILL, shape.prefill, adapter, timing, cache_blocks, policy, registry, clock)
        )
        pools.append(_Pool(Role.DECODE, shape.decode, adapter, timing, cache_blocks, policy, registry, clock))
    else:
        pools.append(_Pool(Role.MIXED, shape.mixed, adapter, timing, cache_blocks, policy, registry, clock))
    last = pools[-1]
    # events: (time, kind, seq, a, b); kind 0: step end of engine b of pool a; 1: the KV of
    # request a arrives at the decode pool; 2: request a arrives
    heap: list[tuple[float, int, int, int, int]] = []
    busy: set[tuple[int, int]] = set()
    owner: dict[str, _Flight] = {}
    outcomes: list[Outcome] = []
    seq = 0

    def push(t: float, kind: int, a: int, b: int = 0) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, kind, seq, a, b))

    def kick(p: int, i: int, now: float) -> None:
        if (p, i) in busy:
            return
        end = pools[p].engines[i].start_step(now)
        if end is not None:
            busy.add((p, i))
            push(end, 0, p, i)

    def submit(p: int, k: int, now: float) -> None:
        pool, a, rid = pools[p], arrivals[k], f"r{k}"
        ctx = RequestContext(rid, "m", "/v1/completions", {"prompt": ""}, token_ids=list(a.prompt))
        i = pool.route(ctx)
        flight = owner.setdefault(rid, _Flight(k, now))
        flight.worker, flight.ctx = i, ctx
        max_tokens = 1 if (pd and p == 0) else a.max_tokens
        pool.engines[i].submit(rid, a.prompt, max_tokens, now, len(a.prompt) if p else 0)
        kick(p, i, now)

    def finish(pool: _Pool, f: Finished) -> None:
        flight = owner[f.request_id]
        assert flight.ctx is not None
        pool.done(flight.ctx, flight.worker)
        if pd and pool is not last:  # prefill done: the KV moves to a decode worker
            flight.cached = f.cached_tokens
            push(f.finished_at + transfer_s_per_token * f.prompt_tokens, 1, flight.k)
            return
        del owner[f.request_id]
        out = f.output_tokens
        outcomes.append(
            Outcome(
                ttft=f.first_token_at - flight.arrived,
                tpot=(f.finished_at - f.first_token_at) / (out - 1) if out > 1 else None,
                e2e=f.finished_at - flight.arrived,
                prompt_tokens=f.prompt_tokens,
                cached_tokens=flight.cached if pd else f.cached_tokens,
            )
        )

    for k, a in enumerate(arrivals):
        push(a.at, 2, k)
    while heap:
        t, kind, _, x, y = heapq.heappop(heap)
        clock[0] = t
        if kind == 2:
            submit(0, x, t)
        elif kind == 1:
            submit(1, x, t)
        else:
            busy.discard((x, y))
            for f in pools[x].engines[y].end_step(t):
                finish(pools[x], f)
            kick(x, y, t)
    return outcomes

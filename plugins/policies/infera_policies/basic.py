"""Basic load-balancing policies: random, least-load, power-of-two, session affinity.

Each is a plain object built once by its factory; presets combine them with the
core ``health`` and ``role`` filters.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from infera_core.request import RequestContext
from infera_core.scheduling.arrays import Floats, state
from infera_core.scheduling.candidates import rows_of
from infera_core.scheduling.config import PluginRef, ProfileConfig, ScorerRef
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.types import (
    DEFAULT_SESSION_HEADERS,
    Endpoint,
    Picker,
    PolicyFactory,
    SchedulerDeps,
    Scorer,
)
from infera_policies.session import session_of

BASE_FILTERS = [PluginRef(name="health"), PluginRef(name="role")]


class SeedParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int | None = None
    """Seed for reproducible choices (tests); default: from the OS."""


class _SeededPicker(Picker):
    """A picker drawing from its own random generator (``seed``: reproducible, for tests)."""

    __slots__ = ("_rng",)

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)


class RandomPicker(_SeededPicker):
    """Uniformly random among the candidates (ignores scores)."""

    name = "random"
    __slots__ = ()

    def pick(self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: Sequence[float]) -> Endpoint:
        return candidates[self._rng.randrange(len(candidates))]


class LeastLoadScorer(Scorer):
    """1 for the fewest in-flight requests (routed by this server), falling linearly to 0."""

    name = "least-load"
    __slots__ = ()

    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        loads = [ep.in_flight for ep in candidates]
        low = min(loads)
        spread = max(loads) - low
        if spread == 0:
            return [1.0] * len(loads)
        return [1.0 - (x - low) / spread for x in loads]

    def score_rows(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> Floats:
        """:meth:`score` over the arrays."""
        loads = state().in_flight[rows_of(candidates)]
        low = loads.min()
        spread = loads.max() - low
        if spread == 0:
            return np.ones(len(loads), np.float64)
        return 1.0 - (loads - low) / spread  # type: ignore[no-any-return]


class PowerOfTwoPicker(_SeededPicker):
    """Two random candidates, the one with fewer in-flight requests (p2c)."""

    name = "power-of-two"
    __slots__ = ()

    def pick(self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: Sequence[float]) -> Endpoint:
        n = len(candidates)
        if n == 1:
            return candidates[0]
        i, j = self._rng.sample(range(n), 2)
        a, b = candidates[i], candidates[j]
        return a if a.in_flight <= b.in_flight else b


class AffinityParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    header: str | None = None
    """Request header carrying the session key (default: the server's ``--session-header``
    list); without one the body's ``prompt_cache_key``, ``user`` or ``metadata.user_id``."""
    load_factor: float = Field(1.25, ge=1.0)
    """Bounded load: a worker takes a session only while its in-flight count is at most
    ``ceil(load_factor * (total in-flight + 1) / workers)``; otherwise the ring moves on."""
    vnodes: int = Field(64, ge=1, le=1024)
    """Points per worker on the hash ring."""


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class SessionAffinityPicker(Picker):
    """Consistent hashing of the session key with bounded load; no key → fewest in-flight."""

    name = "session-affinity"
    __slots__ = ("_headers", "_load_factor", "_next", "_ring", "_ring_ids", "_vnodes")

    def __init__(self, params: AffinityParams, headers: Sequence[str] = DEFAULT_SESSION_HEADERS) -> None:
        self._headers = (params.header.lower(),) if params.header else tuple(h.lower() for h in headers)
        self._load_factor = params.load_factor
        self._vnodes = params.vnodes
        self._ring_ids: tuple[str, ...] = ()
        self._ring: tuple[list[int], list[str]] = ([], [])
        self._next = 0

    def session_key(self, ctx: RequestContext) -> str | None:
        return session_of(ctx, self._headers)

    def _ring_for(self, candidates: Sequence[Endpoint]) -> tuple[list[int], list[str]]:
        ids = tuple(sorted(ep.worker_id for ep in candidates))
        if ids != self._ring_ids:
            points = sorted((_hash(f"{wid}#{v}"), wid) for wid in ids for v in range(self._vnodes))
            self._ring = ([p for p, _ in points], [w for _, w in points])
            self._ring_ids = ids
        return self._ring

    def pick(self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: Sequence[float]) -> Endpoint:
        key = self.session_key(ctx)
        if key is None or len(candidates) == 1:
            least = min(ep.in_flight for ep in candidates)
            best = [ep for ep in candidates if ep.in_flight == least]
            self._next += 1
            return best[self._next % len(best)]
        by_id = {ep.worker_id: ep for ep in candidates}
        total = sum(ep.in_flight for ep in candidates)
        bound = math.ceil(self._load_factor * (total + 1) / len(candidates))
        points, owners = self._ring_for(candidates)
        start = bisect.bisect(points, _hash(key))
        seen: set[str] = set()
        n = len(points)
        for k in range(n):
            wid = owners[(start + k) % n]
            if wid in seen:
                continue
            seen.add(wid)
            ep = by_id[wid]
            if ep.in_flight < bound:
                return ep
            if len(seen) == len(by_id):
                break
        return by_id[owners[start % n]]


def _seed(params: object) -> int | None:
    return params.seed if isinstance(params, SeedParams) else None


def _affinity(params: object, deps: SchedulerDeps) -> Picker:
    p = params if isinstance(params, AffinityParams) else AffinityParams()
    return SessionAffinityPicker(p, deps.session_headers)


def register_basic(registry: PolicyRegistry) -> None:
    """Add the basic policies and their presets (``random``, ``least-load``, ``power-of-two``, ``session-affinity``)."""
    registry.add(
        PolicyFactory(
            "random", "picker", lambda p, d: RandomPicker(_seed(p)), SeedParams, RandomPicker.__doc__ or ""
        )
    )
    registry.add(
        PolicyFactory(
            "least-load", "scorer", lambda p, d: LeastLoadScorer(), None, LeastLoadScorer.__doc__ or ""
        )
    )
    registry.add(
        PolicyFactory(
            "power-of-two",
            "picker",
            lambda p, d: PowerOfTwoPicker(_seed(p)),
            SeedParams,
            PowerOfTwoPicker.__doc__ or "",
        )
    )
    registry.add(
        PolicyFactory(
            "session-affinity", "picker", _affinity, AffinityParams, SessionAffinityPicker.__doc__ or ""
        )
    )
    registry.add_preset(
        "random",
        ProfileConfig(filters=list(BASE_FILTERS), picker=PluginRef(name="random")),
        "A uniformly random healthy worker.",
    )
    registry.add_preset(
        "least-load",
        ProfileConfig(
            filters=list(BASE_FILTERS),
            scorers=[ScorerRef(name="least-load")],
            picker=PluginRef(name="max-score"),
        ),
        "The healthy worker with the fewest in-flight requests (ties: round robin).",
    )
    registry.add_preset(
        "power-of-two",
        ProfileConfig(filters=list(BASE_FILTERS), picker=PluginRef(name="power-of-two")),
        "Power of two choices: the less loaded of two random healthy workers.",
    )
    registry.add_preset(
        "session-affinity",
        ProfileConfig(filters=list(BASE_FILTERS), picker=PluginRef(name="session-affinity")),
        "Same session (--session-header headers, or the body's prompt_cache_key / user) → same worker,"
        " with bounded load.",
    )

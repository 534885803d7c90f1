"""Session affinity as a scorer term: the ``session-affinity`` scorer (part of ``kv-aware``).

A conversation is named by the first request header of ``--session-header`` present
(defaults: ``X-Session-Id``, ``session_id``, ``session-id``, ``X-Session-Affinity``,
``X-Claude-Code-Session-Id``, ``conversation_id`` — what Codex and Claude Code send), else by
the body's ``prompt_cache_key`` (OpenAI's cache-routing hint, which Codex sets), ``user``, or
``metadata.user_id`` (Anthropic clients; ``/v1/messages`` maps it to ``user``).

The scorer remembers the worker each session was last routed to (least recently used sessions
forgotten past ``max_sessions``) and scores that worker 1, every other 0. It is a term of the
cost, not a pin: a worker that is gone, draining or whose breaker is open was already filtered
out, one the imbalance guard finds overloaded too, and the load terms still count — the session
then moves, and sticks to its new worker.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from infera_core.request import RequestContext
from infera_core.scheduling.arrays import Floats
from infera_core.scheduling.candidates import rows_of
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.types import Endpoint, PolicyFactory, SchedulerDeps, Scorer

BODY_FIELDS = ("prompt_cache_key", "user")


class SessionParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    headers: list[str] | None = Field(
        None, description="Headers naming a session (default: the server's --session-header list)."
    )
    body: bool = Field(
        True, description="Without a header, name the session by prompt_cache_key, user or metadata.user_id."
    )
    max_sessions: int = Field(
        100_000, ge=1, description="Sessions remembered (least recently used forgotten)."
    )


def session_of(ctx: RequestContext, headers: Sequence[str], body: bool = True) -> str | None:
    """The request's session key (cached on ``ctx.session_key``), None without one."""
    key = ctx.session_key
    if key is not None:
        return key
    get = ctx.headers.get
    for name in headers:
        value = get(name)
        if value:
            ctx.session_key = key = value
            return key
    if body:
        b = ctx.body
        for field in BODY_FIELDS:
            value = b.get(field)
            if isinstance(value, str) and value:
                ctx.session_key = key = value
                return key
        meta = b.get("metadata")
        if isinstance(meta, dict):
            value = meta.get("user_id")
            if isinstance(value, str) and value:
                ctx.session_key = key = value
                return key
    return None


class SessionAffinityScorer(Scorer):
    """1 for the worker the request's session was last routed to, 0 for the others."""

    name = "session-affinity"
    __slots__ = ("body", "headers", "max_sessions", "sessions")

    def __init__(self, headers: Sequence[str], params: SessionParams | None = None) -> None:
        p = params or SessionParams()
        self.headers = tuple(h.lower() for h in (p.headers if p.headers is not None else headers))
        self.body = p.body
        self.max_sessions = p.max_sessions
        self.sessions: OrderedDict[str, tuple[str, int]] = OrderedDict()
        """session key → (worker id, endpoint row) of its last pick."""

    def _home(self, ctx: RequestContext) -> tuple[str, int] | None:
        key = session_of(ctx, self.headers, self.body)
        return self.sessions.get(key) if key is not None else None

    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        home = self._home(ctx)
        if home is None:
            return [0.0] * len(candidates)
        worker = home[0]
        return [1.0 if ep.worker_id == worker else 0.0 for ep in candidates]

    def score_rows(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> Floats:
        """:meth:`score` over the arrays: the home row, checked to still be the same worker."""
        out = np.zeros(len(candidates), np.float64)
        home = self._home(ctx)
        if home is not None:
            at = np.flatnonzero(rows_of(candidates) == home[1])
            if len(at) and candidates[int(at[0])].worker_id == home[0]:
                out[int(at[0])] = 1.0
        return out

    def explain(
        self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: Sequence[float]
    ) -> list[dict[str, Any]]:
        home = self._home(ctx)
        return [{"home": home is not None and ep.worker_id == home[0]} for ep in candidates]

    def on_routed(self, ctx: RequestContext, endpoint: Endpoint) -> None:
        key = session_of(ctx, self.headers, self.body)
        if key is None:
            return
        sessions = self.sessions
        sessions[key] = (endpoint.worker_id, endpoint.row)
        sessions.move_to_end(key)
        if len(sessions) > self.max_sessions:
            sessions.popitem(last=False)


def register_session(registry: PolicyRegistry) -> None:
    """Add the ``session-affinity`` scorer (the ``session-affinity`` preset is the picker of
    :mod:`infera_policies.basic`: consistent hashing with bounded load, same session keys)."""

    def build(p: Any, d: SchedulerDeps) -> Scorer:
        return SessionAffinityScorer(d.session_headers, p if isinstance(p, SessionParams) else None)

    registry.add(
        PolicyFactory("session-affinity", "scorer", build, SessionParams, SessionAffinityScorer.__doc__ or "")
    )

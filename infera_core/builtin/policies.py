"""Core scheduling defaults, registered like any plugin's.

Filters ``model``, ``health`` (routable and circuit breaker closed or due for a
half-open probe) and ``role``; pickers ``max-score`` (ties → fewer in-flight →
round robin) and ``round-robin``; preset ``round-robin``. Everything else lives in
the ``infera-policies`` distribution.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from infera_core.plugin.spec import hookimpl
from infera_core.request import RequestContext
from infera_core.scheduling.arrays import Floats, state
from infera_core.scheduling.candidates import FilterMemo, rows_of
from infera_core.scheduling.config import PluginRef, ProfileConfig
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.types import Endpoint, Filter, Picker, PolicyFactory, SchedulerDeps
from infera_core.worker import Role, Status


class ModelFilter(Filter):
    """Keeps endpoints serving ``ctx.model`` — as their model or one of their LoRA adapters
    (the server already groups by model)."""

    name = "model"
    __slots__ = ()

    def filter(self, ctx: RequestContext, candidates: list[Endpoint]) -> list[Endpoint]:
        model = ctx.model
        return [ep for ep in candidates if ep.record.model == model or model in ep.record.lora_adapters]


class HealthFilter(Filter):
    """Keeps active endpoints whose breaker is closed, or open and due for a probe."""

    name = "health"
    __slots__ = ("_clock", "_memo")

    def __init__(self, clock: object = None) -> None:
        self._clock: Callable[[], float] = clock if callable(clock) else time.monotonic
        self._memo = FilterMemo()

    def filter(self, ctx: RequestContext, candidates: list[Endpoint]) -> list[Endpoint]:
        # the same table list, nothing changed since: the same answer (O(1), not O(workers))
        memo = self._memo.get(candidates, None, self._clock)
        if memo is not None:
            return memo
        active = Status.ACTIVE
        out = [ep for ep in candidates if ep.record.status is active]
        until = float("inf")
        if any(ep.breaker_open for ep in out):
            now = self._clock()
            waiting = [ep.breaker_retry_at for ep in out if ep.breaker_open and now < ep.breaker_retry_at]
            if waiting:
                until = min(waiting)  # a probe falls due then: decide again
            out = [ep for ep in out if not ep.breaker_open or now >= ep.breaker_retry_at]
        return self._memo.put(candidates, None, out, until)


class RoleParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    roles: list[Role] | None = None
    """Allowed roles; default: the request's role (``mixed`` for plain requests)."""


class RoleFilter(Filter):
    """Keeps endpoints whose role matches the request's (or the configured roles)."""

    name = "role"
    __slots__ = ("_memo", "_roles")

    def __init__(self, roles: list[Role] | None) -> None:
        self._roles = frozenset(roles) if roles else None
        self._memo = FilterMemo()

    def filter(self, ctx: RequestContext, candidates: list[Endpoint]) -> list[Endpoint]:
        roles = self._roles
        key = ctx.role if roles is None else None
        memo = self._memo.get(candidates, key, None)
        if memo is not None:
            return memo
        if roles is None:
            role = ctx.role
            out = [ep for ep in candidates if ep.record.role is role]
        else:
            out = [ep for ep in candidates if ep.record.role in roles]
        return self._memo.put(candidates, key, out)


class RoundRobinPicker(Picker):
    """Cycles through the candidates, ignoring scores."""

    name = "round-robin"
    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def pick(self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: Sequence[float]) -> Endpoint:
        i = self._next
        self._next = i + 1
        return candidates[i % len(candidates)]


class MaxScorePicker(Picker):
    """The highest score; ties go to fewer in-flight requests, then round robin."""

    name = "max-score"
    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def pick_rows(self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: Floats) -> Endpoint:
        """:meth:`pick` over arrays (the same choice): ``scores`` aligned with ``candidates``."""
        best = np.flatnonzero(scores >= scores.max() - 1e-9)
        if len(best) > 1:
            loads = state().in_flight[rows_of(candidates)[best]]
            best = best[loads == loads.min()]
        i = self._next
        self._next = i + 1
        return candidates[int(best[i % len(best)])]

    def pick(self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: Sequence[float]) -> Endpoint:
        if not scores:
            best = list(candidates)
        else:
            top = max(scores)
            best = [ep for ep, s in zip(candidates, scores, strict=True) if s >= top - 1e-9]
        if len(best) > 1:
            least = min(ep.in_flight for ep in best)
            best = [ep for ep in best if ep.in_flight == least]
        i = self._next
        self._next = i + 1
        return best[i % len(best)]


def _build_role(params: object, deps: SchedulerDeps) -> Filter:
    roles = params.roles if isinstance(params, RoleParams) else None
    return RoleFilter(roles)


def register_defaults(registry: PolicyRegistry) -> None:
    """Add the core filters, pickers and the ``round-robin`` preset."""
    registry.add(
        PolicyFactory("model", "filter", lambda p, d: ModelFilter(), None, ModelFilter.__doc__ or "")
    )
    registry.add(
        PolicyFactory(
            "health", "filter", lambda p, d: HealthFilter(d.clock), None, HealthFilter.__doc__ or ""
        )
    )
    registry.add(PolicyFactory("role", "filter", _build_role, RoleParams, RoleFilter.__doc__ or ""))
    registry.add(
        PolicyFactory(
            "round-robin", "picker", lambda p, d: RoundRobinPicker(), None, RoundRobinPicker.__doc__ or ""
        )
    )
    registry.add(
        PolicyFactory(
            "max-score", "picker", lambda p, d: MaxScorePicker(), None, MaxScorePicker.__doc__ or ""
        )
    )
    registry.add_preset(
        "round-robin",
        ProfileConfig(
            filters=[PluginRef(name="health"), PluginRef(name="role")],
            picker=PluginRef(name="round-robin"),
        ),
        "Healthy workers of the model in turn.",
    )


@hookimpl
def infera_register_policies(registry: PolicyRegistry) -> None:
    register_defaults(registry)

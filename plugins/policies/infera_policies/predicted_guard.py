"""The ``predicted-guard`` filter: the imbalance guard of the ``predicted-latency`` preset, in seconds.

``imbalance-guard`` bounds *counts* (in-flight + recent dispatches), which on a fleet of
unequal workers is what must not be balanced. This one bounds the **predicted prefill
backlog**: it drops the workers whose queue (``busy(w) − now``, the ``predicted-latency``
scorer's model: the uncached prompt tokens routed there and not yet answered, over the worker's
learned prefill rate) is more than ``gap_s`` seconds longer than the shortest one's. So a burst
of one shared prefix cannot pile onto the worker that holds it beyond ``gap_s`` of waiting,
whatever the cache-affinity scores say; on a fleet of unequal workers the fast ones, whose queues
drain sooner, stay eligible for more requests. Never drops every candidate.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infera_core.request import RequestContext
from infera_core.scheduling.candidates import Candidates
from infera_core.scheduling.types import Endpoint, Filter

PREDICTOR_KEY = "infera_policies.predictor"
"""``SchedulerDeps.extra`` key of the ``predicted-latency`` scorer the guard reads (the last built)."""


class PredictedGuardParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gap_s: float = Field(
        2.0,
        gt=0,
        description="Seconds of predicted prefill backlog a worker may have over the least backlogged.",
    )


class PredictedGuard(Filter):
    """Drops workers whose predicted prefill backlog exceeds the shortest one's by more than ``gap_s``."""

    name = "predicted-guard"

    def __init__(self, extra: dict[str, Any], params: PredictedGuardParams | None = None) -> None:
        self.extra = extra
        self.gap = (params or PredictedGuardParams()).gap_s

    def filter(self, ctx: RequestContext, candidates: list[Endpoint]) -> list[Endpoint]:
        model = self.extra.get(PREDICTOR_KEY)
        if model is None or len(candidates) < 2:
            return candidates
        cands = candidates if type(candidates) is Candidates else Candidates(candidates)
        wait = model.request_backlog(ctx, cands.rows)  # the scorer reuses it for this request
        if wait is None:  # no queue is busy: every backlog is 0
            return candidates
        bar = float(wait.min()) + self.gap
        if float(wait.max()) <= bar:  # the common case: nobody that far behind
            return candidates
        return cands.subset(wait <= bar)  # the least backlogged always stays

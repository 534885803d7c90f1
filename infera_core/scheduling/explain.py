"""Routing explanations: what the scheduler saw and why it picked, recorded only when asked.

A request carries a :class:`Decision` in ``ctx.explain`` only when its client asked for an
explanation (``X-Infera-Explain``) or the server samples decisions; otherwise the field is
None and the scheduler runs its ordinary path (one ``is None`` test per step). With a
``Decision`` the scheduler filters one filter at a time (recording which workers each
removed) and scores with every scorer's per-candidate path, recording each term; the pick is
the same as the ordinary path's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from infera_core.request import RequestContext
from infera_core.scheduling.profile import Profile
from infera_core.scheduling.types import Endpoint

MAX_CANDIDATES = 8
"""Candidates shown in an explanation (the best scored); the count of the others is given."""
MAX_EXCLUDED = 16
"""Excluded workers listed by name (the count of the others is given)."""


class Decision:
    """One request's routing decision (the last attempt's, when it was retried)."""

    __slots__ = ("at", "attempt", "candidates", "excluded", "model", "pd", "picked", "policy", "request_id")

    def __init__(self) -> None:
        self.at = 0.0
        self.request_id = ""
        self.model = ""
        self.policy = ""
        self.attempt = 0
        self.picked: str | None = None
        self.excluded: list[tuple[str, str]] = []
        """(worker, what removed it): a filter's name, ``retry`` (failed an earlier attempt)
        or ``in-flight-cap``."""
        self.candidates: list[dict[str, Any]] = []
        self.pd: dict[str, Any] | None = None
        """``pd.mode: auto`` on a fleet with pairs and mixed workers: the per-request choice
        (``pd`` or ``local``) and the two predicted TTFTs (kept across attempts)."""

    def begin(self, ctx: RequestContext, policy: str) -> None:
        """A new attempt: what an earlier one recorded is replaced."""
        self.at = time.time()
        self.request_id = ctx.request_id
        self.model = ctx.model
        self.policy = policy
        self.attempt += 1
        self.picked = None
        self.excluded = []
        self.candidates = []

    def removed(self, before: Sequence[Endpoint], after: Sequence[Endpoint], by: str) -> None:
        kept = {id(ep) for ep in after}
        self.excluded.extend((ep.worker_id, by) for ep in before if id(ep) not in kept)

    def as_dict(self) -> dict[str, Any]:
        """The JSON of the explanation (bounded: the best :data:`MAX_CANDIDATES` candidates,
        the first :data:`MAX_EXCLUDED` excluded workers)."""
        ranked = sorted(self.candidates, key=lambda c: -c["score"])
        out: dict[str, Any] = {
            "request_id": self.request_id,
            "time": round(self.at, 3),
            "model": self.model,
            "policy": self.policy,
            "attempt": self.attempt,
            "picked": self.picked,
            "candidates": ranked[:MAX_CANDIDATES],
            "excluded": [{"worker": w, "by": by} for w, by in self.excluded[:MAX_EXCLUDED]],
        }
        if self.pd is not None:
            out["pd"] = self.pd
        more = len(ranked) - MAX_CANDIDATES
        if more > 0:
            out["more_candidates"] = more
        more = len(self.excluded) - MAX_EXCLUDED
        if more > 0:
            out["more_excluded"] = more
        return out


def _round(x: float) -> float:
    return round(x, 4)


def explained_filter(profile: Profile, ctx: RequestContext, candidates: list[Endpoint]) -> list[Endpoint]:
    """:meth:`Profile.filter`, recording what each filter removed in ``ctx.explain``."""
    rec: Decision = ctx.explain
    for f in profile.filters:
        after = f.filter(ctx, candidates)
        rec.removed(candidates, after, f.name)
        candidates = after
        if not candidates:
            break
    return candidates


def explained_pick(profile: Profile, ctx: RequestContext, candidates: list[Endpoint]) -> Endpoint:
    """:meth:`Profile.pick` through the per-candidate path, recording every score term."""
    rec: Decision = ctx.explain
    n = len(candidates)
    total = [0.0] * n
    terms: list[dict[str, Any]] = [{} for _ in range(n)]
    for scorer, w in zip(profile.scorers, profile.weights, strict=True):
        raw = scorer.score(ctx, candidates)
        details = scorer.explain(ctx, candidates, raw)
        for i, s in enumerate(raw):
            clamped = 0.0 if s < 0.0 else 1.0 if s > 1.0 else s
            total[i] += clamped * w
            term: dict[str, Any] = {"score": _round(clamped), "weight": w}
            if details is not None:
                term.update(details[i])
            terms[i][scorer.name] = term
    chosen = profile.picker.pick(ctx, candidates, total if profile.scorers else [])
    for scorer in profile.scorers:
        scorer.on_routed(ctx, chosen)
    rec.candidates = [
        {"worker": ep.worker_id, "score": _round(total[i]), "terms": terms[i], "in_flight": ep.in_flight}
        for i, ep in enumerate(candidates)
    ]
    rec.picked = chosen.worker_id
    return chosen

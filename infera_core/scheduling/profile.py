"""A built scheduling profile: filters → weighted scorers → one picker, as plain objects.

Built once from a :class:`ProfileConfig` through the catalog's policy factories
(``catalog.policies.factory(kind, name)``); per request only direct method calls.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

from infera_core.errors import ConfigError, UnknownNameError
from infera_core.request import RequestContext
from infera_core.scheduling.arrays import ARRAY_MIN, weighted_sum
from infera_core.scheduling.config import PluginRef, ProfileConfig
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.types import Endpoint, Filter, Picker, PolicyKind, SchedulerDeps, Scorer


class Profile:
    """One scheduling profile. ``name`` labels its routing-latency metric.

    With many candidates, when every scorer has ``score_rows`` and the picker ``pick_rows``
    (the array forms, see :mod:`infera_core.scheduling.arrays`), scores are combined over
    arrays; the choice is the same as the per-candidate path's.
    """

    __slots__ = (
        "array_min",
        "bounded",
        "filters",
        "name",
        "needs_tokens",
        "picker",
        "scorers",
        "text_fallback",
        "vectorized",
        "weights",
    )

    def __init__(
        self,
        name: str,
        filters: Sequence[Filter],
        scorers: Sequence[tuple[Scorer, float]],
        picker: Picker,
    ) -> None:
        self.name = name
        self.filters = tuple(filters)
        self.scorers = tuple(s for s, _ in scorers)
        self.weights = tuple(w for _, w in scorers)
        self.bounded = tuple(getattr(s, "bounded", False) is True for s in self.scorers)
        self.picker = picker
        self.needs_tokens = any(s.needs_tokens for s in self.scorers)
        self.text_fallback = any(s.text_fallback for s in self.scorers)
        self.vectorized = bool(self.scorers) and (
            all(callable(getattr(s, "score_rows", None)) for s in self.scorers)
            and callable(getattr(picker, "pick_rows", None))
        )
        self.array_min = ARRAY_MIN
        """Candidates from which the array path is taken (tests set 0 or a huge number)."""

    def routing_mode(self, tokenized: bool) -> str | None:
        """How this profile routes a model's prompts: ``tokens`` (by token ids: the model has a
        routing tokenizer), ``text`` (no tokenizer; a scorer falls back to text prefixes),
        ``load`` (no tokenizer and no text fallback), or None when no scorer reads the prompt."""
        if self.needs_tokens:
            return "tokens" if tokenized else "text" if self.text_fallback else "load"
        return "text" if self.text_fallback else None

    def filter(self, ctx: RequestContext, candidates: list[Endpoint]) -> list[Endpoint]:
        for f in self.filters:
            candidates = f.filter(ctx, candidates)
            if not candidates:
                break
        return candidates

    def pick(self, ctx: RequestContext, candidates: list[Endpoint]) -> Endpoint:
        """Score the (already filtered, non-empty) candidates and pick one."""
        if self.vectorized and len(candidates) >= self.array_min:
            chosen = self._pick_rows(ctx, candidates)
        else:
            chosen = self.picker.pick(ctx, candidates, self._scores(ctx, candidates))
        for scorer in self.scorers:
            scorer.on_routed(ctx, chosen)
        return chosen

    def _scores(self, ctx: RequestContext, candidates: list[Endpoint]) -> list[float]:
        if not self.scorers:
            return []
        # weighted sum of clamped scores, inlined: this runs per candidate per request
        scorers, weights = self.scorers, self.weights
        w = weights[0]
        scores = [(0.0 if s < 0.0 else w if s > 1.0 else s * w) for s in scorers[0].score(ctx, candidates)]
        for k in range(1, len(scorers)):
            w = weights[k]
            scores = [
                a + (0.0 if s < 0.0 else w if s > 1.0 else s * w)
                for a, s in zip(scores, scorers[k].score(ctx, candidates), strict=True)
            ]
        return scores

    def _pick_rows(self, ctx: RequestContext, candidates: list[Endpoint]) -> Endpoint:
        # each scorer's array, then Σ clip(part, 0, 1) · weight in one pass per part (a bounded
        # scorer's part unclipped: clipping [0, 1] changes nothing)
        parts = [scorer.score_rows(ctx, candidates) for scorer in self.scorers]  # type: ignore[attr-defined]
        total = weighted_sum(parts, self.weights, self.bounded) if parts else None
        return self.picker.pick_rows(ctx, candidates, total)  # type: ignore[attr-defined,no-any-return]

    def finished(self, ctx: RequestContext, endpoint: Endpoint, ok: bool) -> None:
        for scorer in self.scorers:
            scorer.on_finished(ctx, endpoint, ok)

    def first_token(self, ctx: RequestContext, endpoint: Endpoint) -> None:
        """The first token from ``endpoint`` reached the router (:meth:`Scorer.on_first_token`)."""
        for scorer in self.scorers:
            scorer.on_first_token(ctx, endpoint)

    def timing(self, ctx: RequestContext, endpoint: Endpoint, since_first: float, itl: float | None) -> None:
        """A stream from ``endpoint`` was relayed whole (:meth:`Scorer.on_timing`)."""
        for scorer in self.scorers:
            scorer.on_timing(ctx, endpoint, since_first, itl)


def _build(
    registry: PolicyRegistry, kind: PolicyKind, ref: PluginRef, deps: SchedulerDeps, where: str
) -> object:
    try:
        factory = registry.factory(kind, ref.name)
    except UnknownNameError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    try:
        params = factory.parse_params(ref.params)
    except (ValidationError, ValueError) as exc:
        raise ConfigError(f"{where}: bad parameters for {kind} {ref.name!r}: {exc}") from None
    return factory.build(params, deps)


def build_profile(
    name: str, config: ProfileConfig, registry: PolicyRegistry, deps: SchedulerDeps, where: str = "router"
) -> Profile:
    """Assemble a :class:`Profile`; bad names or parameters raise :class:`ConfigError`."""
    filters: list[Filter] = []
    for ref in config.filters:
        obj = _build(registry, "filter", ref, deps, where)
        if not isinstance(obj, Filter):
            raise ConfigError(f"{where}: filter {ref.name!r} built a {type(obj).__name__}, not a Filter")
        filters.append(obj)
    scorers: list[tuple[Scorer, float]] = []
    for sref in config.scorers:
        obj = _build(registry, "scorer", sref, deps, where)
        if not isinstance(obj, Scorer):
            raise ConfigError(f"{where}: scorer {sref.name!r} built a {type(obj).__name__}, not a Scorer")
        scorers.append((obj, sref.weight))
    picker = _build(registry, "picker", config.picker, deps, where)
    if not isinstance(picker, Picker):
        raise ConfigError(
            f"{where}: picker {config.picker.name!r} built a {type(picker).__name__}, not a Picker"
        )
    return Profile(name, filters, scorers, picker)

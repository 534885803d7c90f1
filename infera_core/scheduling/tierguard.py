"""Keeping lower priority tiers off part of the fleet while a higher tier is active.

A critical request that lands on a worker busy with a sheddable flood waits for the step in
progress and then shares its prefill step with the flood's decodes; the in-flight cap alone
(``--queue-headroom``) gives it a slot, not a quiet worker. While a request of a higher tier
was dispatched in the last ``window`` seconds, :class:`TierGuard` holds each lower tier to
``share`` of the model's workers (those already holding most of its requests, so the others
drain) and keeps it off the workers running a higher tier; the higher tier prefers the
workers with no lower-tier request. With no higher tier seen for ``window`` seconds the lower
tiers get the whole fleet back (nothing is held back from a tier running alone).

Pure bookkeeping, no I/O: the router queue and ``bench/fleet/fairness.py`` share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class TierGuard:
    """Per model: the tiers running on each worker and when each tier was last dispatched."""

    window: float
    """Seconds a higher tier counts as active after its last dispatch (0: off)."""
    share: float = 0.5
    """The part of the workers a lower tier keeps to while a higher one is active (0-1]."""
    running: dict[str, dict[int, int]] = field(default_factory=dict)
    seen: dict[int, float] = field(default_factory=dict)

    def started(self, worker: str, tier: int, now: float) -> None:
        tiers = self.running.setdefault(worker, {})
        tiers[tier] = tiers.get(tier, 0) + 1
        self.seen[tier] = now

    def ended(self, worker: str, tier: int) -> None:
        tiers = self.running.get(worker)
        if tiers is None or tier not in tiers:
            return
        tiers[tier] -= 1
        if not tiers[tier]:
            del tiers[tier]
            if not tiers:
                del self.running[worker]

    def guarded(self, tier: int, now: float) -> bool:
        """Whether a tier above ``tier`` was dispatched in the last ``window`` seconds."""
        w = self.window
        return w > 0 and any(t > tier and now - at <= w for t, at in self.seen.items())

    def avoid(self, tier: int, workers: Sequence[str], now: float) -> set[str]:
        """The workers a request of ``tier`` keeps off now. For a guarded (lower) tier this may
        be all of them: it waits. For a higher tier it never is: with no worker free of lower
        tiers it goes where the policy says."""
        if self.window <= 0:
            return set()
        running = self.running
        if self.guarded(tier, now):
            avoid = {w for w in workers if any(t > tier for t in running.get(w, ()))}
            load = {w: sum(n for t, n in running.get(w, {}).items() if t <= tier) for w in workers}
            hosts = sorted((w for w in workers if w not in avoid and load[w]), key=lambda w: -load[w])
            limit = max(1, int(self.share * len(workers)))
            if len(hosts) >= limit:
                keep = set(hosts[:limit])
                avoid.update(w for w in workers if w not in keep)
            return avoid
        lower = {w for w in workers if any(t < tier for t in running.get(w, ()))}
        return lower if len(lower) < len(workers) else set()

"""``infera-run plan``: the smallest simulated fleet whose replay of a trace meets an SLO.

Every fleet (workers × policy × PD ratio) replays the same arrivals in virtual time
(:mod:`infera_core.bench.virtual`); a fleet *meets* the SLO when every percentile target holds
over the replay's requests. Attainment is the share of requests within every target.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from infera_core.bench.stats import parse_duration, percentile
from infera_core.bench.virtual import Arrival, FleetShape, Outcome, replay
from infera_core.engines.timing import TimingProfile, VirtualEngines
from infera_core.errors import ConfigError
from infera_core.scheduling.config import ProfileConfig
from infera_core.scheduling.registry import PolicyRegistry

_TARGET = re.compile(r"^(ttft|tpot|e2e)_p([0-9]+(?:\.[0-9]+)?)$")


@dataclass(frozen=True, slots=True)
class Target:
    """``metric`` (ttft, tpot, e2e) at percentile ``pct`` must be at most ``seconds``."""

    metric: str
    pct: float
    seconds: float

    @property
    def key(self) -> str:
        return f"{self.metric}_p{self.pct:g}"


def parse_plan_slo(text: str) -> list[Target]:
    """``"ttft_p90=2s,tpot_p90=50ms"`` → targets; :class:`ConfigError` naming the bad part."""
    out: list[Target] = []
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, val = part.partition("=")
        m = _TARGET.match(key.strip().lower())
        if not sep or not m or not 0 < float(m.group(2)) < 100:
            raise ConfigError(
                f"--slo: expected METRIC_pNN=DURATION with METRIC ttft, tpot or e2e, e.g. "
                f"ttft_p90=2s,tpot_p90=50ms (got {part.strip()!r})"
            )
        out.append(Target(m.group(1), float(m.group(2)), parse_duration(val, f"--slo {key.strip()}")))
    if not out:
        raise ConfigError("--slo: give at least one target, e.g. ttft_p90=2s,tpot_p90=50ms")
    return out


def _values(outcomes: Sequence[Outcome], metric: str) -> list[float]:
    got = (getattr(o, metric) for o in outcomes)
    return [v for v in got if v is not None]


@dataclass(slots=True)
class FleetResult:
    """One fleet's replay against the SLO."""

    workers: int
    policy: str
    shape: str
    """``N`` (mixed) or ``PpP+DdD`` (prefill + decode)."""
    observed: dict[str, float | None]
    meets: bool
    margin: float | None
    """min over targets of (target − observed) / target: > 0 when met, the headroom left."""
    attainment: float
    hit: float
    requests: int
    split: str = "mixed"
    """``mixed`` or the PD ratio (``P:D``) the fleet was built at."""

    def to_json(self) -> dict[str, Any]:
        return {
            "workers": self.workers,
            "policy": self.policy,
            "shape": self.shape,
            "split": self.split,
            "meets_slo": self.meets,
            "margin": self.margin,
            "attainment": self.attainment,
            "hit_rate": self.hit,
            "requests": self.requests,
            **self.observed,
        }


def judge(
    outcomes: Sequence[Outcome], targets: Sequence[Target], workers: int, policy: str, shape: str
) -> FleetResult:
    """How a replay's requests fare against ``targets``."""
    observed: dict[str, float | None] = {}
    margins: list[float] = []
    for metric in ("ttft", "tpot", "e2e"):
        vals = _values(outcomes, metric)
        for p in sorted({50.0, 90.0, 99.0} | {t.pct for t in targets if t.metric == metric}):
            observed[f"{metric}_p{p:g}"] = percentile(vals, p)
    for t in targets:
        got = observed[t.key]
        margins.append((t.seconds - got) / t.seconds if got is not None else 1.0)
    good = sum(
        1 for o in outcomes if all((v := getattr(o, t.metric)) is None or v <= t.seconds for t in targets)
    )
    prompt = sum(o.prompt_tokens for o in outcomes)
    return FleetResult(
        workers=workers,
        policy=policy,
        shape=shape,
        observed=observed,
        meets=bool(outcomes) and min(margins) >= 0,
        margin=min(margins) if margins else None,
        attainment=good / len(outcomes) if outcomes else 0.0,
        hit=sum(o.cached_tokens for o in outcomes) / prompt if prompt else 0.0,
        requests=len(outcomes),
    )


def parse_workers(text: str) -> list[int]:
    """``"1..8"``, ``"2,4,8"`` or ``"4"`` → sorted fleet sizes (ConfigError when bad)."""
    sizes: set[int] = set()
    try:
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("..")
            if sep:
                sizes.update(range(int(lo), int(hi) + 1))
            elif part.strip():
                sizes.add(int(part))
    except ValueError:
        raise ConfigError(f"--workers: expected N, A..B or a comma list (got {text!r})") from None
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"--workers: fleet sizes must be >= 1 (got {text!r})")
    return sorted(sizes)


def parse_pd_ratios(text: str | None) -> list[tuple[int, int] | None]:
    """``"mixed,1:1,1:3"`` → [None, (1, 1), (1, 3)]: None is a fleet of mixed workers."""
    if not text:
        return [None]
    out: list[tuple[int, int] | None] = []
    for part in text.split(","):
        part = part.strip()
        if part in ("mixed", "0"):
            out.append(None)
            continue
        p, sep, d = part.partition(":")
        try:
            ratio = (int(p), int(d))
        except ValueError:
            ratio = (0, 0)
        if not sep or min(ratio) < 1:
            raise ConfigError(f"--pd-ratio: expected mixed or P:D such as 1:3 (got {part!r})")
        out.append(ratio)
    return out


def split(workers: int, ratio: tuple[int, int]) -> tuple[int, int] | None:
    """Prefill and decode workers of a fleet of ``workers`` at ``ratio`` (None below two)."""
    if workers < 2:
        return None
    prefill = min(workers - 1, max(1, round(workers * ratio[0] / (ratio[0] + ratio[1]))))
    return prefill, workers - prefill


def answer(results: Sequence[FleetResult]) -> FleetResult | None:
    """The smallest fleet that meets the SLO (the widest margin among fleets of that size)."""
    ok = [r for r in results if r.meets]
    if not ok:
        return None
    return min(ok, key=lambda r: (r.workers, -(r.margin or 0.0)))


def plan_fleets(
    arrivals: Sequence[Arrival],
    targets: Sequence[Target],
    sizes: Sequence[int],
    policies: Sequence[tuple[str, ProfileConfig]],
    ratios: Sequence[tuple[int, int] | None],
    adapter: VirtualEngines,
    timing: TimingProfile,
    registry: PolicyRegistry,
    cache_blocks: int,
) -> list[FleetResult]:
    """Replay ``arrivals`` on every fleet (size × policy × PD ratio) and judge each one."""
    results: list[FleetResult] = []
    for name, config in policies:
        for ratio in ratios:
            for n in sizes:
                if ratio is None:
                    shape = FleetShape(mixed=n)
                else:
                    pd = split(n, ratio)
                    if pd is None:
                        continue
                    shape = FleetShape(prefill=pd[0], decode=pd[1])
                outcomes = replay(arrivals, shape, adapter, timing, (name, config), registry, cache_blocks)
                result = judge(outcomes, targets, n, name, shape.label())
                result.split = "mixed" if ratio is None else f"{ratio[0]}:{ratio[1]}"
                results.append(result)
    return results


def series(results: Sequence[FleetResult]) -> list[tuple[str, list[tuple[int, float]]]]:
    """Attainment by fleet size, one series per policy and PD split (for the plot)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in results:
        label = r.policy if r.split == "mixed" else f"{r.policy} PD {r.split}"
        out.setdefault(label, []).append((r.workers, r.attainment))
    return list(out.items())

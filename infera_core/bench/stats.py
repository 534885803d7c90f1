"""Summaries of a run: percentiles, throughput, SLO goodput, errors by kind."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infera_core.errors import ConfigError

if TYPE_CHECKING:  # the client needs aiohttp (optional); the statistics only name its result type
    from infera_core.bench.client import RequestResult

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear-interpolated percentile (like numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass(frozen=True, slots=True)
class Slo:
    """Per-request targets in seconds; a request meets the SLO when all given ones hold."""

    ttft: float | None = None
    itl: float | None = None
    e2e: float | None = None

    def met(self, r: RequestResult) -> bool:
        if not r.ok or r.ttft is None:
            return False
        if self.ttft is not None and r.ttft > self.ttft:
            return False
        if self.itl is not None and r.itls and sum(r.itls) / len(r.itls) > self.itl:
            return False
        return not (self.e2e is not None and (r.e2e is None or r.e2e > self.e2e))

    def describe(self) -> str:
        parts = [
            f"{k}≤{_fmt_s(v)}" for k, v in (("ttft", self.ttft), ("itl", self.itl), ("e2e", self.e2e)) if v
        ]
        return ", ".join(parts) or "none"


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*$")


def parse_duration(text: str, flag: str) -> float:
    """``"500ms"``, ``"0.5s"`` or ``"0.5"`` (seconds) → seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ConfigError(f"{flag}: {text!r} is not a duration (e.g. 500ms or 0.5s)")
    v = float(m.group(1))
    return v / 1000.0 if m.group(2) == "ms" else v


def parse_slo(text: str | None) -> Slo:
    """``"ttft=500ms,itl=50ms"`` → :class:`Slo`."""
    if not text:
        return Slo()
    vals: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, val = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("ttft", "itl", "e2e"):
            raise ConfigError(f"--slo: expected ttft=…,itl=…,e2e=… (got {part.strip()!r})")
        vals[key] = parse_duration(val, f"--slo {key}")
    return Slo(**vals)


def _fmt_s(v: float) -> str:
    return f"{v * 1000:.0f}ms" if v < 1 else f"{v:.2f}s"


def _dist(values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {f"p{p}": percentile(values, p) for p in PERCENTILES}
    out["mean"] = sum(values) / len(values) if values else None
    return out


@dataclass(slots=True)
class CacheStats:
    """Prefix-cache figures from worker ``/metrics`` deltas over the run."""

    queries: float = 0.0
    hits: float = 0.0
    """GPU prefix-cache hits (tokens)."""
    offload_hits: float | None = None
    """Tokens loaded from an offloaded tier (CPU/disk: ``vllm:external_prefix_cache_hits``);
    None when no worker exports it."""
    per_worker: dict[str, dict[str, float]] = field(default_factory=dict)
    timeline: list[tuple[float, float, float]] = field(default_factory=list)
    """(seconds from start, cumulative hits, cumulative queries) samples."""

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.queries if self.queries > 0 else None

    @property
    def offload_hit_rate(self) -> float | None:
        """Prompt tokens served from the offloaded tier, as a fraction of all queried."""
        if self.offload_hits is None or self.queries <= 0:
            return None
        return self.offload_hits / self.queries


def summarize(
    results: Sequence[RequestResult],
    duration: float,
    slo: Slo,
    cache: CacheStats | None = None,
) -> dict[str, Any]:
    """The headline numbers of a run (JSON-ready)."""
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    e2e = [r.e2e for r in ok if r.e2e is not None]
    itl = [x for r in ok for x in r.itls]
    out_tokens = sum(r.output_tokens for r in ok)
    errors = Counter(r.error for r in results if r.error)
    good = sum(1 for r in ok if slo.met(r))
    prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None and r.prompt_tokens]
    usage_hit = sum(cached) / sum(prompt) if cached and prompt and len(cached) == len(prompt) else None
    dur = max(duration, 1e-9)
    workers = Counter(r.worker for r in ok if r.worker)
    return {
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": dict(errors),
        "duration_s": duration,
        "requests_per_s": len(ok) / dur,
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / dur,
        "prompt_tokens": sum(prompt),
        "ttft_s": _dist(ttft),
        "itl_s": _dist(itl),
        "e2e_s": _dist(e2e),
        "slo": slo.describe(),
        "goodput_requests_per_s": good / dur,
        "slo_attainment": good / len(results) if results else None,
        "prefix_cache_hit_rate": cache.hit_rate if cache else None,
        "offload_hit_rate": cache.offload_hit_rate if cache else None,
        "usage_cached_fraction": usage_hit,
        "requests_per_worker": dict(workers) or (_metric_requests(cache) if cache else {}),
    }


def _metric_requests(cache: CacheStats) -> dict[str, int]:
    return {w: int(v.get("requests", 0)) for w, v in cache.per_worker.items() if v.get("requests")}

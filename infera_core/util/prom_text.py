"""Reading Prometheus text exposition: sums, per-label samples, histograms (no client library)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
OFFLOAD_HITS = "vllm:external_prefix_cache_hits_total"
"""Tokens a KV connector supplied (vLLM's CPU offloading, LMCache; the sim's CPU tier)."""
REQUESTS = ("vllm:request_success_total", "vllm:e2e_request_latency_seconds_count")
PROMPT_TOKENS = "vllm:prompt_tokens_total"
WANTED = (HITS, QUERIES, OFFLOAD_HITS, PROMPT_TOKENS, *REQUESTS)


def parse_metrics(text: str, names: Iterable[str] = WANTED) -> dict[str, float]:
    """Sum of every sample of each wanted metric name (labels summed over); a name with no
    readable sample is absent. A sample without a value (a truncated scrape) is passed over."""
    wanted = set(names)
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        end = brace if 0 <= brace < space or (brace >= 0 and space < 0) else space
        name = line[:end]
        if name not in wanted:
            continue
        value = line.rsplit("}", 1)[-1].split() if brace >= 0 else line[end:].split()
        try:
            out[name] = out.get(name, 0.0) + float(value[0])
        except (ValueError, IndexError):
            continue
    return out


def by_label(text: str, name: str, label: str) -> dict[str, float]:
    """Samples of ``name`` summed per value of ``label`` (e.g. picks per worker)."""
    out: dict[str, float] = {}
    key = f'{label}="'
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        labels, _, value = line[len(name) + 1 :].rpartition("} ")
        if key not in labels:
            continue
        lv = labels.split(key, 1)[1].split('"', 1)[0]
        try:
            out[lv] = out.get(lv, 0.0) + float(value.split()[0])
        except (ValueError, IndexError):
            continue
    return out


def histogram(text: str, name: str) -> dict[str, Any] | None:
    """Buckets (``le`` → cumulative count), sum and count of a histogram, labels summed."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    seen = False
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        rest = line[len(name) :]
        value = float(line.rsplit(" ", 1)[-1])
        if rest.startswith("_bucket{"):
            seen = True
            le = rest.split('le="', 1)[1].split('"', 1)[0]
            key = float("inf") if le == "+Inf" else float(le)
            buckets[key] = buckets.get(key, 0.0) + value
        elif rest.startswith("_sum"):
            total += value
        elif rest.startswith("_count"):
            count += value
    if not seen:
        return None
    return {"buckets": dict(sorted(buckets.items())), "sum": total, "count": count}


def histogram_quantile(hist: Mapping[str, Any], q: float) -> float | None:
    """Upper bucket bound holding the ``q`` quantile (Prometheus-style, no interpolation)."""
    count = float(hist["count"])
    if count <= 0:
        return None
    target = q * count
    for le, cum in hist["buckets"].items():
        if cum >= target:
            return float(le)
    return None


def histogram_delta(after: Mapping[str, Any], before: Mapping[str, Any] | None) -> dict[str, Any]:
    if before is None:
        return dict(after)
    b = before["buckets"]
    return {
        "buckets": {k: v - b.get(k, 0.0) for k, v in after["buckets"].items()},
        "sum": after["sum"] - before["sum"],
        "count": after["count"] - before["count"],
    }

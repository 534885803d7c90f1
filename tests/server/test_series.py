"""Lean per-request series scrape exactly like ``prometheus_client``'s own metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from infera_core.server.series import LeanCollector, LeanCounter, LeanHistogram

BUCKETS = (0.005, 0.01, 0.5, 1, 10)
VALUES = [0.0, 0.005, 0.0051, 0.01, 0.3, 1.0, 9.99, 10.0, 11.0, 1e6]


def _samples(registry: CollectorRegistry) -> list[str]:
    return [
        line
        for line in generate_latest(registry).decode().splitlines()
        if not line.startswith("#") and "_created" not in line
    ]


def test_histogram_and_counter_match_prometheus_client() -> None:
    ref = CollectorRegistry()
    h = Histogram("lat_seconds", "Latency", ["route", "model"], buckets=BUCKETS, registry=ref)
    c = Counter("reqs", "Requests", ["model", "status"], registry=ref)
    lean = CollectorRegistry()
    lh = LeanHistogram("lat_seconds", "Latency", ["route", "model"], BUCKETS)
    lc = LeanCounter("reqs", "Requests", ["model", "status"])
    lean.register(LeanCollector([lh, lc]))
    for i, v in enumerate(VALUES):
        labels = ("/v1/completions", f"m{i % 2}")
        h.labels(*labels).observe(v)
        lh.child(labels).observe(v)
        c.labels(labels[1], "200").inc(i)
        lc.child((labels[1], "200")).inc(i)
    assert _samples(lean) == _samples(ref)
    assert 'lat_seconds_bucket{le="0.005",model="m1",route="/v1/completions"} 1.0' in _samples(lean)

"""Prometheus metrics of one server (a private ``CollectorRegistry`` per app).

Per-request series use cached label children (``labels()`` is slow); per-worker
gauges (in-flight, picks, breaker state) are read from the endpoint table at scrape
time, so the hot path never touches them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from infera_core.scheduling.types import Endpoint

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
DECISION_BUCKETS = (1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 0.01)


class _FleetCollector(Collector):
    def __init__(self, endpoints: Callable[[], Iterable[Endpoint]], breaker_state: Callable[[Endpoint], str]):
        self._endpoints = endpoints
        self._state = breaker_state

    def collect(self) -> Iterable[Any]:
        inflight = GaugeMetricFamily(
            "infera_worker_in_flight", "Requests in flight per worker", labels=["worker"]
        )
        picks = CounterMetricFamily(
            "infera_worker_picks", "Routing picks per worker", labels=["worker", "model"]
        )
        breaker = GaugeMetricFamily(
            "infera_worker_breaker_state",
            "Circuit breaker per worker (0 closed, 1 open, 2 half-open)",
            labels=["worker"],
        )
        codes = {"closed": 0.0, "open": 1.0, "half-open": 2.0}
        for ep in self._endpoints():
            inflight.add_metric([ep.worker_id], ep.in_flight)
            picks.add_metric([ep.worker_id, ep.record.model], ep.picks)
            breaker.add_metric([ep.worker_id], codes[self._state(ep)])
        yield inflight
        yield picks
        yield breaker


class ServerMetrics:
    """All series of one server. Hot-path methods take plain values."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "infera_requests", "Requests by route, model and status", ["route", "model", "status"], registry=r
        )
        self.ttft = Histogram(
            "infera_time_to_first_token_seconds",
            "Time to the first streamed chunk, at the router",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "infera_inter_token_latency_seconds",
            "Mean gap between streamed chunks of one request, at the router",
            ["model"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "infera_request_duration_seconds",
            "End-to-end request latency (streams: until the last byte)",
            ["route", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter("infera_tokens", "Tokens from usage reports", ["model", "kind"], registry=r)
        self.retries = Counter("infera_retries", "Requests retried on another worker", ["model"], registry=r)
        self.decision = Histogram(
            "infera_routing_decision_seconds",
            "Time to choose a worker, per policy",
            ["policy"],
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self.breaker_opened = Counter("infera_breaker_opened", "Circuit breakers opened", registry=r)
        self._cache: dict[tuple[Any, ...], Any] = {}

    def watch_fleet(
        self, endpoints: Callable[[], Iterable[Endpoint]], breaker_state: Callable[[Endpoint], str]
    ) -> None:
        self.registry.register(_FleetCollector(endpoints, breaker_state))

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._cache.get(key)
        if child is None:
            child = self._cache[key] = metric.labels(*labels)
        return child

    def request_done(self, route: str, model: str, status: int, seconds: float) -> None:
        self._child(self.requests, route, model, str(status)).inc()
        self._child(self.e2e, route, model).observe(seconds)

    def stream_timing(self, model: str, ttft: float, mean_itl: float | None) -> None:
        self._child(self.ttft, model).observe(ttft)
        if mean_itl is not None:
            self._child(self.itl, model).observe(mean_itl)

    def usage(self, model: str, prompt: int, completion: int) -> None:
        if prompt:
            self._child(self.tokens, model, "prompt").inc(prompt)
        if completion:
            self._child(self.tokens, model, "completion").inc(completion)

    def retried(self, model: str) -> None:
        self._child(self.retries, model).inc()

    def decided(self, policy: str, seconds: float) -> None:
        self._child(self.decision, policy).observe(seconds)

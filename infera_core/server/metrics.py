"""Prometheus metrics of one server (a private ``CollectorRegistry`` per app).

Per-request series are lean (:mod:`infera_core.server.series`: no lock, no label lookup
through ``prometheus_client`` per request); per-worker
gauges (in-flight, picks, breaker state) are read from the endpoint table at scrape
time, so the hot path never touches them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from infera_core.scheduling.types import PREDICTION_ERROR_BUCKETS, Endpoint, LatencyStats
from infera_core.server.series import LeanCollector, LeanCounter, LeanHistogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
DECISION_BUCKETS = (
    1e-6,
    5e-6,
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    0.01,
    0.025,
    0.05,
    0.1,
)
"""Routing decisions: microseconds for simple pickers, milliseconds for kv-aware over big fleets."""


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


class _LatencyCollector(Collector):
    """Predicted against observed TTFT per worker, and the prediction error, when a
    latency-predicting scorer (``predicted-latency``) routes."""

    def __init__(self, stats: LatencyStats) -> None:
        self._stats = stats

    def collect(self) -> Iterable[Any]:
        st = self._stats
        if not st.predicted and not any(st.counts):
            return
        predicted = GaugeMetricFamily(
            "infera_worker_predicted_ttft_seconds",
            "TTFT the router predicted for the last request it routed to the worker",
            labels=["worker"],
        )
        observed = GaugeMetricFamily(
            "infera_worker_observed_ttft_seconds",
            "TTFT of the last request from the worker whose first token came back",
            labels=["worker"],
        )
        for worker, v in list(st.predicted.items()):
            predicted.add_metric([worker], v)
        for worker, v in list(st.observed.items()):
            observed.add_metric([worker], v)
        buckets, total = [], 0
        for bound, n in zip((*PREDICTION_ERROR_BUCKETS, float("inf")), st.counts, strict=True):
            total += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), total))
        error = HistogramMetricFamily(
            "infera_ttft_prediction_error_seconds",
            "Absolute error of the router's TTFT prediction (observed − predicted)",
            buckets=buckets,
            sum_value=st.error_sum,
        )
        yield predicted
        yield observed
        yield error


class ServerMetrics:
    """All series of one server. Hot-path methods take plain values; the per-request
    series are :mod:`infera_core.server.series` (plain numbers, exported at scrape time)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.latency: LatencyStats | None = None
        """Predicted and observed TTFT per worker (:meth:`watch_latency`), for the dashboard."""
        r = self.registry
        self.requests = LeanCounter(
            "infera_requests", "Requests by route, model and status", ["route", "model", "status"]
        )
        self.ttft = LeanHistogram(
            "infera_time_to_first_token_seconds",
            "Time to the first streamed chunk, at the router",
            ["model"],
            LATENCY_BUCKETS,
        )
        self.itl = LeanHistogram(
            "infera_inter_token_latency_seconds",
            "Mean gap between streamed chunks of one request, at the router",
            ["model"],
            ITL_BUCKETS,
        )
        self.e2e = LeanHistogram(
            "infera_request_duration_seconds",
            "End-to-end request latency (streams: until the last byte)",
            ["route", "model"],
            LATENCY_BUCKETS,
        )
        self.tokens = LeanCounter("infera_tokens", "Tokens from usage reports", ["model", "kind"])
        self.retries = LeanCounter("infera_retries", "Requests retried on another worker", ["model"])
        self.decision = LeanHistogram(
            "infera_routing_decision_seconds",
            "Time to choose a worker, per policy",
            ["policy"],
            DECISION_BUCKETS,
        )
        self.migrations = LeanCounter(
            "infera_migrations",
            "Streams that broke after their first byte, by model, reason (upstream_closed, hung,"
            " drain, worker_gone) and result (resumed, finished, refused, limit, failed)",
            ["model", "reason", "result"],
        )
        self.resume = LeanHistogram(
            "infera_migration_resume_seconds",
            "From a stream breaking to its continuation's first bytes reaching the client",
            ["model"],
            LATENCY_BUCKETS,
        )
        r.register(
            LeanCollector(
                [
                    self.requests,
                    self.ttft,
                    self.itl,
                    self.e2e,
                    self.tokens,
                    self.retries,
                    self.decision,
                    self.migrations,
                    self.resume,
                ]
            )
        )
        self.breaker_opened = Counter("infera_breaker_opened", "Circuit breakers opened", registry=r)

    def watch_fleet(
        self, endpoints: Callable[[], Iterable[Endpoint]], breaker_state: Callable[[Endpoint], str]
    ) -> None:
        self.registry.register(_FleetCollector(endpoints, breaker_state))

    def watch_latency(self, stats: LatencyStats) -> None:
        """Export (and keep for the dashboard) what latency-predicting scorers report."""
        self.latency = stats
        self.registry.register(_LatencyCollector(stats))

    def request_done(self, route: str, model: str, status: int, seconds: float) -> None:
        self.requests.child((route, model, str(status))).value += 1.0
        self.e2e.child((route, model)).observe(seconds)

    def stream_timing(self, model: str, ttft: float, mean_itl: float | None) -> None:
        self.ttft.child((model,)).observe(ttft)
        if mean_itl is not None:
            self.itl.child((model,)).observe(mean_itl)

    def usage(self, model: str, prompt: int, completion: int) -> None:
        if prompt:
            self.tokens.child((model, "prompt")).value += prompt
        if completion:
            self.tokens.child((model, "completion")).value += completion

    def retried(self, model: str) -> None:
        self.retries.child((model,)).value += 1.0

    def migrated(self, model: str, reason: str, result: str, seconds: float | None) -> None:
        self.migrations.child((model, reason, result)).value += 1.0
        if seconds is not None:
            self.resume.child((model,)).observe(seconds)

    def decided(self, policy: str, seconds: float) -> None:
        self.decision.child((policy,)).observe(seconds)

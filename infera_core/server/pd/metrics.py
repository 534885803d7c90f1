"""PD series on the server's registry: pairs, failures by reason, TTFT phases, per-role load.

* ``infera_pd_pairs_total{prefill,decode}`` — pairs chosen.
* ``infera_pd_failures_total{reason}`` — every PD failure, by reason (see ``docs/explanation/pd.md``).
* ``infera_pd_phase_seconds{model,phase}`` — ``prefill`` (the prefill leg, sent → answered),
  ``transfer`` (prefill answered → decode's response headers: KV transfer plus decode
  admission), ``decode_wait`` (decode leg sent → its headers). The first decode token is the
  router's TTFT minus these.
* ``infera_pd_role_in_flight{model,role}`` / ``infera_pd_role_workers{model,role}`` — read
  from the endpoint table at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from infera_core.scheduling.types import Endpoint
from infera_core.server.series import LeanCollector, LeanCounter, LeanHistogram

PHASE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _RoleCollector(Collector):
    def __init__(self, endpoints: Callable[[], Iterable[Endpoint]]) -> None:
        self._endpoints = endpoints

    def collect(self) -> Iterable[Any]:
        inflight = GaugeMetricFamily(
            "infera_pd_role_in_flight",
            "Requests in flight per model and worker role",
            labels=["model", "role"],
        )
        workers = GaugeMetricFamily(
            "infera_pd_role_workers", "Active workers per model and role", labels=["model", "role"]
        )
        load: dict[tuple[str, str], int] = {}
        count: dict[tuple[str, str], int] = {}
        for ep in self._endpoints():
            key = (ep.record.model, str(ep.role))
            load[key] = load.get(key, 0) + ep.in_flight
            if ep.record.routable:
                count[key] = count.get(key, 0) + 1
        for key, value in sorted(load.items()):
            inflight.add_metric(list(key), value)
            workers.add_metric(list(key), count.get(key, 0))
        yield inflight
        yield workers


class PdMetrics:
    """PD series; the hot-path methods update lean series (:mod:`infera_core.server.series`)."""

    def __init__(self, registry: CollectorRegistry, endpoints: Callable[[], Iterable[Endpoint]]) -> None:
        self.pairs = LeanCounter("infera_pd_pairs", "Prefill/decode pairs chosen", ["prefill", "decode"])
        self.failures = LeanCounter("infera_pd_failures", "PD failures by reason", ["reason"])
        self.phases = LeanHistogram(
            "infera_pd_phase_seconds",
            "Time-to-first-token phases of PD requests",
            ["model", "phase"],
            PHASE_BUCKETS,
        )
        registry.register(LeanCollector([self.pairs, self.failures, self.phases]))
        registry.register(_RoleCollector(endpoints))

    def paired(self, prefill: str, decode: str) -> None:
        self.pairs.child((prefill, decode)).inc()

    def failed(self, reason: str) -> None:
        self.failures.child((reason,)).inc()

    def phase(self, model: str, phase: str, seconds: float) -> None:
        if seconds >= 0:
            self.phases.child((model, phase)).observe(seconds)

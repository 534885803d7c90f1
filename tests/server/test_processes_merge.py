"""How the figures of N server processes add up (:mod:`infera_core.server.aggregate`), on
the registries two real servers' metrics would export."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from infera_core.server.aggregate import family_json, merge_families, merge_stats, merge_workers
from infera_core.server.metrics import ServerMetrics


class _Gauges(Collector):
    def __init__(self, in_flight: float, blocks: float) -> None:
        self.values = (in_flight, blocks)

    def collect(self) -> list[GaugeMetricFamily]:
        g = GaugeMetricFamily("infera_worker_in_flight", "in flight", labels=["worker"])
        g.add_metric(["w0"], self.values[0])
        b = GaugeMetricFamily("infera_kv_index_blocks", "blocks", labels=["worker"])
        b.add_metric(["w0"], self.values[1])
        return [g, b]


def _process(requests: int, in_flight: float, blocks: float) -> list[dict[str, object]]:
    m = ServerMetrics()
    for _ in range(requests):
        m.request_done("/v1/completions", "m", 200, 0.02)
    m.registry.register(_Gauges(in_flight, blocks))
    return [family_json(f) for f in m.registry.collect()]


def _text(families: list[list[dict[str, object]]]) -> str:
    class Merged:
        def collect(self) -> object:
            return merge_families(families)

    return generate_latest(Merged()).decode()  # type: ignore[arg-type]


def test_counters_and_histograms_add_up_and_fleet_gauges_do_not() -> None:
    text = _text([_process(3, 2, 100), _process(5, 1, 100)])
    assert 'infera_requests_total{model="m",route="/v1/completions",status="200"} 8.0' in text
    assert 'infera_request_duration_seconds_count{model="m",route="/v1/completions"} 8.0' in text
    assert 'infera_request_duration_seconds_bucket{le="0.025",model="m",route="/v1/completions"} 8.0' in text
    assert 'infera_worker_in_flight{worker="w0"} 3.0' in text  # each process's own: summed
    assert 'infera_kv_index_blocks{worker="w0"} 100.0' in text  # the same fleet seen twice: not doubled


def test_one_process_merged_is_its_own_scrape() -> None:
    m = ServerMetrics()
    m.request_done("/v1/chat/completions", "m", 200, 0.3)
    alone = [family_json(f) for f in m.registry.collect()]
    assert _text([alone]) == generate_latest(m.registry).decode()


def test_workers_sum_in_flight_and_picks_and_show_the_worst_breaker() -> None:
    merged = merge_workers([{"w0": [1, 10, "closed"]}, {"w0": [2, 5, "open"], "w1": [0, 1, "closed"]}])
    assert merged == {"w0": (3, 15, "open"), "w1": (0, 1, "closed")}


def test_stats_sum_requests_and_histogram_buckets() -> None:
    def stats(n: int) -> dict[str, object]:
        return {
            "workers": [{"worker_id": "w0", "in_flight": 0, "picks": n, "breaker": "closed"}],
            "requests": [{"route": "/v1/completions", "model": "m", "status": "200", "count": n}],
            "tokens": [],
            "retries": 1,
            "breakers_opened": 0,
            "pd_failures": {},
            "histograms": {
                "e2e": {"bounds": [1.0], "labels": ["model"], "series": {"m": {"counts": [n, 0], "sum": 0.5}}}
            },
            "usage": None,
        }

    out = merge_stats([stats(2), stats(3)])
    assert out["requests"] == [{"route": "/v1/completions", "model": "m", "status": "200", "count": 5}]
    assert out["workers"][0]["picks"] == 5 and out["retries"] == 2
    assert out["histograms"]["e2e"]["series"]["m"] == {"counts": [5, 0], "sum": 1.0}

"""``infera_core.util.prom_text``: Prometheus text read without a client library."""

from __future__ import annotations

from infera_core.engines.support import metrics_sum
from infera_core.util.prom_text import parse_metrics

SCRAPE = "\n".join(
    [
        "# TYPE vllm:prefix_cache_hits_total counter",
        'vllm:prefix_cache_hits_total{engine="0"} 3',
        'vllm:prefix_cache_hits_total{engine="1"} 4',
        "vllm:prefix_cache_queries_total 10",
        'vllm:prefix_cache_hits_total{engine="2"}',
        "vllm:prefix_cache_queries_total",
    ]
)
"""Two samples per name and, last, a scrape cut off after the labels (no value)."""


def test_parse_metrics_passes_over_a_sample_with_no_value() -> None:
    names = ["vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"]
    assert parse_metrics(SCRAPE, names) == {names[0]: 7.0, names[1]: 10.0}


def test_metrics_sum_is_the_sum_of_the_parsed_metrics() -> None:
    assert metrics_sum(SCRAPE, ["vllm:prefix_cache_hits_total"]) == 7.0
    assert metrics_sum(SCRAPE, ["vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"]) == 17.0
    assert metrics_sum(SCRAPE, ["vllm:num_requests_running"]) is None

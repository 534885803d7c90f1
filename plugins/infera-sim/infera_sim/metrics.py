"""vLLM-named Prometheus metrics of the sim (text exposition, built by hand: hot path)."""

from __future__ import annotations

from bisect import bisect_left

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0)


class Histogram:
    __slots__ = ("bounds", "count", "counts", "help", "name", "sum")

    def __init__(self, name: str, help: str, bounds: tuple[float, ...]) -> None:
        self.name = name
        self.help = help
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, labels: str, out: list[str]) -> None:
        out.append(f"# HELP {self.name} {self.help}")
        out.append(f"# TYPE {self.name} histogram")
        acc = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            acc += n
            out.append(f'{self.name}_bucket{{{labels},le="{bound}"}} {float(acc)}')
        out.append(f'{self.name}_bucket{{{labels},le="+Inf"}} {float(self.count)}')
        out.append(f"{self.name}_count{{{labels}}} {float(self.count)}")
        out.append(f"{self.name}_sum{{{labels}}} {self.sum}")


class SimMetrics:
    """Counters and histograms the engine updates; gauges are read from the engine at scrape."""

    __slots__ = (
        "e2e",
        "external_hits",
        "external_queries",
        "generation_tokens",
        "itl",
        "labels",
        "offload",
        "preemptions",
        "prefix_hits",
        "prefix_queries",
        "prompt_tokens",
        "success",
        "ttft",
    )

    def __init__(self, model: str) -> None:
        self.labels = f'engine="0",model_name="{model}"'
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.offload = False
        """A CPU tier exists: export its queries and hits (tokens) as vLLM's connector does."""
        self.external_queries = 0
        self.external_hits = 0
        self.preemptions = 0
        self.success: dict[str, int] = {}
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency.", ITL_BUCKETS
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of end to end latency.", E2E_BUCKETS
        )

    def render(self, running: int, waiting: int, kv_usage: float) -> str:
        lb = self.labels
        out: list[str] = []

        def metric(name: str, kind: str, help: str, value: float, labels: str = lb) -> None:
            out.append(f"# HELP {name} {help}")
            out.append(f"# TYPE {name} {kind}")
            out.append(f"{name}{{{labels}}} {float(value)}")

        metric(
            "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", running
        )
        metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", waiting)
        metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", kv_usage)
        metric(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in tokens.",
            self.prefix_queries,
        )
        metric("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in tokens.", self.prefix_hits)
        if self.offload:
            metric(
                "vllm:external_prefix_cache_queries_total",
                "counter",
                "External prefix cache queries from KV connector cross-instance cache sharing, in tokens.",
                self.external_queries,
            )
            metric(
                "vllm:external_prefix_cache_hits_total",
                "counter",
                "External prefix cache hits from KV connector cross-instance cache sharing, in tokens.",
                self.external_hits,
            )
        metric(
            "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", self.prompt_tokens
        )
        metric(
            "vllm:generation_tokens_total", "counter", "Number of generation tokens.", self.generation_tokens
        )
        out.append("# HELP vllm:request_success_total Count of successfully processed requests.")
        out.append("# TYPE vllm:request_success_total counter")
        for reason in ("stop", "length", "abort"):
            n = self.success.get(reason, 0)
            out.append(f'vllm:request_success_total{{{lb},finished_reason="{reason}"}} {float(n)}')
        for hist in (self.ttft, self.itl, self.e2e):
            hist.render(lb, out)
        out.append("")
        return "\n".join(out)


def parse_gauges(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum of each named sample over its label sets in a Prometheus text page."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return out

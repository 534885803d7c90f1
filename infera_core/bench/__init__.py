"""``infera-run bench``: workload generation, load driving, metrics and reports.

The library is usable on its own (``infera-run up --demo`` and the fleet-scale
script drive it directly):

* :mod:`~infera_core.bench.workloads` — text workloads (random, shared-prefix, multi-turn)
* :mod:`~infera_core.bench.trace` — Mooncake trace replay (token-id prompts)
* :mod:`~infera_core.bench.client` — one streamed request, timed (TTFT, ITL, e2e)
* :mod:`~infera_core.bench.runner` — closed / open loop arrival, live progress
* :mod:`~infera_core.bench.scrape` — worker ``/metrics`` deltas (prefix-cache hits)
* :mod:`~infera_core.bench.stats` — percentiles, SLO goodput, the results model
* :mod:`~infera_core.bench.report` — terminal table, JSON, Markdown + PNG report
"""

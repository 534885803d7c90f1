"""What the router-wide ``--max-inflight-per-worker`` costs per request under
``serve --processes N`` (:mod:`infera_core.scheduling.shared_load`), beside the per-process
count it replaces.

Per request the router filters the candidates by the cap (``under_cap``), then counts
the request in flight on the chosen worker and out again. This times those steps
in-process, interleaved over ``--rounds`` rounds, for fleets of ``--workers`` (the
per-endpoint path below 48 candidates, numpy's above), with the counts kept by this
process alone (``local``: ``--processes 1``, or N before) and mirrored into the shared
table (``shared``); it reports the median µs per request and the difference::

    .venv/bin/python -m bench.router.shared_inflight [--rounds 7] [--requests 20000] [--workers 4,64]
"""

from __future__ import annotations

import argparse
import statistics
import time

from infera_core.scheduling.arrays import state
from infera_core.scheduling.scheduler import under_cap
from infera_core.scheduling.shared_load import SharedLoad
from infera_core.scheduling.types import Endpoint
from infera_core.server.fleet import EndpointTable
from infera_core.worker import WorkerRecord


def per_request_us(eps: list[Endpoint], n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        kept = under_cap(eps, 1_000_000)
        ep = kept[i % len(kept)]
        ep.in_flight += 1
        ep.in_flight -= 1
    return (time.perf_counter() - t0) / n * 1e6


def fleet(workers: int) -> EndpointTable:
    table = EndpointTable()
    for i in range(workers):
        table.put(WorkerRecord(worker_id=f"w{i}", url=f"http://10.0.0.1:{8000 + i}", model="m", engine="x"))
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--workers", default="4,64", help="fleet sizes, comma-separated")
    ap.add_argument("--processes", type=int, default=2, help="columns in the shared table")
    args = ap.parse_args()
    load = SharedLoad(args.processes)
    load.attach(0)
    print(f"{'workers':>8} {'local µs':>9} {'shared µs':>10} {'diff':>7}")
    for workers in (int(w) for w in args.workers.split(",")):
        local_t, shared_t = fleet(workers), fleet(workers)
        shared_t.share_load(load)
        state().shared = None
        local_eps, shared_eps = local_t.candidates("m"), shared_t.candidates("m")
        local: list[float] = []
        shared: list[float] = []
        for _ in range(args.rounds):
            state().shared = None
            local.append(per_request_us(local_eps, args.requests))
            state().shared = load
            shared.append(per_request_us(shared_eps, args.requests))
        state().shared = None
        a, b = statistics.median(local), statistics.median(shared)
        print(f"{workers:>8} {a:>9.2f} {b:>10.2f} {b - a:>+7.2f}")


if __name__ == "__main__":
    main()

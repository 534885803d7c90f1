"""What a cluster-wide API-key budget costs per request: a router's own budgets vs the leased
slices of :mod:`infera_core.server.global_budgets` on a real etcd, side by side.

Per request the router admits (``ClientAuth.admit_waiting``: reserve ``tokens_per_day``,
take one ``requests_per_minute``) and settles; this times those calls in-process on one event
loop, interleaved in ``--rounds`` rounds, for a key with both budgets (that never bite) and
one with ``tokens_per_day`` only, and counts the requests that found their slice empty and
waited for a lease (``misses``)::

    .venv/bin/python -m bench.router.global_budgets_cost [--rounds 5] [--requests 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from infera_core.discovery.base import DiscoverySettings
from infera_core.discovery.etcd import EtcdDiscovery
from infera_core.server.budget_slices import LeaseMiss
from infera_core.server.global_budgets import GlobalBudgets
from infera_core.server.keys import KeyRing
from infera_core.testing.etcd import EtcdServer

KEYS = {
    "keys": [
        {"name": "both", "key": "sk-both", "requests_per_minute": 10**9, "tokens_per_day": 10**15},
        {"name": "tokens", "key": "sk-tokens", "tokens_per_day": 10**15},
    ]
}


async def per_request_us(ring: KeyRing, token: bytes, n: int) -> tuple[float, int]:
    principal = ring.lookup(token)
    assert principal is not None
    misses = 0
    t0 = time.perf_counter()
    for i in range(n):
        charge = None
        for _ in range(3):  # as ClientAuth.admit_waiting
            try:
                charge = ring.admit(principal, "m", 100, 10)
                break
            except LeaseMiss as miss:
                misses += 1
                await miss.wait()
        assert charge is not None
        ring.settle(principal, charge, 30)
        if i % 1000 == 0:
            await asyncio.sleep(0)  # the background leases run
    return (time.perf_counter() - t0) / n * 1e6, misses


async def run(rounds: int, requests: int, path: Path, endpoint: str) -> None:
    local = KeyRing(path)
    store = EtcdDiscovery(DiscoverySettings(etcd_endpoints=[endpoint]))
    await store.start()
    budgets = GlobalBudgets(store, "bench")
    shared = KeyRing(path)
    shared.share(budgets)
    await budgets.start()
    results: dict[tuple[str, str], list[tuple[float, int]]] = {}
    try:
        for r in range(rounds):
            cases = [("local", local), ("global", shared)]
            for name, ring in cases if r % 2 == 0 else cases[::-1]:
                for key in ("both", "tokens"):
                    got = await per_request_us(ring, f"sk-{key}".encode(), requests)
                    results.setdefault((name, key), []).append(got)
    finally:
        await budgets.close()
        await store.close()
    print(f"admit + settle, µs per request (median of {rounds} rounds of {requests})")
    print("| key | own budgets | global (etcd) | difference | requests that waited for a lease |")
    print("|---|---:|---:|---:|---:|")
    for key in ("both", "tokens"):
        a = statistics.median(us for us, _ in results[("local", key)])
        b = statistics.median(us for us, _ in results[("global", key)])
        misses = sum(m for _, m in results[("global", key)])
        print(f"| {key} | {a:.2f} | {b:.2f} | {b - a:+.2f} | {misses} of {rounds * requests} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=20000)
    args = ap.parse_args()
    etcd = EtcdServer()
    etcd.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "keys.yaml"
            path.write_text(yaml.safe_dump(KEYS))
            asyncio.run(run(args.rounds, args.requests, path, etcd.endpoint))
    finally:
        etcd.close()


if __name__ == "__main__":
    main()

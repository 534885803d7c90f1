"""What an API key's budgets cost per request: one process's vs the shared ones of
``serve --processes N`` (:mod:`infera_core.server.budgets`), side by side.

Per request the router calls ``lookup`` (the presented key), ``admit`` (model, budgets)
and ``spent`` (its tokens). This times those three calls in-process, interleaved in
``--rounds`` rounds, for a key with both budgets (that never bite) and one with
``tokens_per_day`` only, on a :class:`KeyRing` alone (``local``: ``--processes 1``) and
one bound to a :class:`SharedBudgets` (``shared``); it reports the median µs per
request and the difference. ``--contend N`` adds N forked processes doing the same on
the same table the whole time (lock contention, as N busy server processes)::

    .venv/bin/python -m bench.router.key_budgets [--rounds 7] [--requests 50000] [--contend 1]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from infera_core.server.budgets import SharedBudgets
from infera_core.server.keys import KeyRing

KEYS = {
    "keys": [
        {"name": "both", "key": "sk-both", "requests_per_minute": 10**9, "tokens_per_day": 10**15},
        {"name": "tokens", "key": "sk-tokens", "tokens_per_day": 10**15},
    ]
}


def per_request_us(ring: KeyRing, token: bytes, n: int) -> float:
    lookup, admit, spent = ring.lookup, ring.admit, ring.spent
    t0 = time.perf_counter()
    for _ in range(n):
        p = lookup(token)
        assert p is not None
        admit(p, "m")
        spent(p, 30)
    return (time.perf_counter() - t0) / n * 1e6


def contend(path: Path, budgets: SharedBudgets, index: int) -> int:
    pid = os.fork()
    if pid == 0:  # a busy sibling process until killed
        budgets.attach(index)
        ring = KeyRing(path)
        ring.share(budgets)
        while True:
            per_request_us(ring, b"sk-both", 1000)
    return pid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=50000)
    ap.add_argument("--contend", type=int, default=0, help="busy sibling processes on the same table")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "keys.yaml"
        path.write_text(yaml.safe_dump(KEYS))
        budgets = SharedBudgets(1 + args.contend)
        local = KeyRing(path)
        shared = KeyRing(path)
        shared.share(budgets)
        pids = [contend(path, budgets, i + 1) for i in range(args.contend)]
        try:
            results: dict[tuple[str, str], list[float]] = {}
            for r in range(args.rounds):
                cases = [("local", local), ("shared", shared)]
                for name, ring in cases if r % 2 == 0 else cases[::-1]:
                    for key in ("both", "tokens"):
                        us = per_request_us(ring, f"sk-{key}".encode(), args.requests)
                        results.setdefault((name, key), []).append(us)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    print(f"lookup + admit + spent, µs per request (median of {args.rounds}), {args.contend} busy siblings")
    print("| key | local (--processes 1) | shared (--processes N) | shared − local |")
    print("|---|---|---|---|")
    for key in ("both", "tokens"):
        a = statistics.median(results[("local", key)])
        b = statistics.median(results[("shared", key)])
        print(f"| {key} | {a:.2f} | {b:.2f} | {b - a:+.2f} |")


if __name__ == "__main__":
    main()

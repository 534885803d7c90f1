"""Two ``infera-run serve`` replicas on the NATS plane: do they pick the same worker?

Starts a ``nats-server -js``, ``--workers`` sim workers (``infera-run worker sim
--request-transport nats --kv-event-transport nats``, NATS discovery) and two ``serve``
replicas (``--router-policy kv-aware``), then feeds both replicas the same shared-prefix
workload: each request goes to both at once (each router decides on the KV events of
every earlier request, which reach it through JetStream). Reported: for requests whose
prefix is cached (their group was sent before), how often both replicas picked the same
worker (``x-infera-worker``), and the prefix-cache picks per replica.

    .venv/bin/python -m bench.fleet.nats_replicas [--workers 4] [--groups 16] [--questions 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time

import httpx

from infera_core.util.nats_server import NatsServer
from infera_core.util.net import free_port, stop_groups


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "infera_core", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


async def wait_fleet(client: httpx.AsyncClient, n: int, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            data = (await client.get("/v1/workers")).json()["data"]
            if sum(w["status"] == "active" for w in data) == n:
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        await asyncio.sleep(0.2)
    raise SystemExit(f"{client.base_url}: the fleet of {n} did not appear within {within:g} s")


def workload(groups: int, questions: int, prefix_len: int, seed: int) -> list[tuple[int, int, str]]:
    rng = random.Random(seed)
    prefixes = [" ".join(f"g{g}w{rng.randrange(10**6)}" for _ in range(prefix_len)) for g in range(groups)]
    reqs = [
        (g, q, f"{prefixes[g]} question {q}: " + " ".join(f"q{rng.randrange(10**6)}" for _ in range(24)))
        for g in range(groups)
        for q in range(questions)
    ]
    rng.shuffle(reqs)
    return reqs


async def run(args: argparse.Namespace, urls: list[str]) -> None:
    clients = [httpx.AsyncClient(base_url=u, timeout=60) for u in urls]
    try:
        for c in clients:
            await wait_fleet(c, args.workers, 120)
        seen: set[int] = set()
        agree = cached = 0
        for group, _q, text in workload(args.groups, args.questions, args.prefix_len, args.seed):
            body = {"model": "sim-model", "prompt": text, "max_tokens": args.output_len}
            answers = await asyncio.gather(*[c.post("/v1/completions", json=body) for c in clients])
            if any(r.status_code != 200 for r in answers):
                raise SystemExit(
                    f"a request failed: {[r.status_code for r in answers]} {answers[0].text[:200]}"
                )
            picks = {r.headers["x-infera-worker"] for r in answers}
            if group in seen:
                cached += 1
                agree += len(picks) == 1
            seen.add(group)
        print(
            f"{args.workers} workers, 2 serve replicas (kv-aware), {args.groups} groups × {args.questions} requests:"
            f" same worker for {agree}/{cached} = {100 * agree / max(cached, 1):.1f} % of the requests"
            " whose prefix was cached"
        )
    finally:
        for c in clients:
            await c.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--prefix-len", type=int, default=300)
    ap.add_argument("--output-len", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    nats = NatsServer()
    nats.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERA_")}
    env.update(INFERA_DISCOVERY="nats", INFERA_NATS_URL=nats.url, PYTHONUNBUFFERED="1")
    procs = []
    try:
        for i in range(args.workers):
            argv = ["worker", "sim", "--model", "sim-model", "--worker-id", f"sim-{i}"]
            argv += ["--request-transport", "nats", "--kv-event-transport", "nats", "--", "--speedup", "20"]
            procs.append(start(argv, env))
        ports = [free_port(), free_port()]
        for port in ports:
            procs.append(start(["serve", "--port", str(port), "--router-policy", "kv-aware"], env))
        asyncio.run(run(args, [f"http://127.0.0.1:{p}" for p in ports]))
    finally:
        stop_groups(procs, grace=20)
        nats.close()


if __name__ == "__main__":
    main()

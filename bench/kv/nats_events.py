"""KV events through JetStream: relay and router throughput per core, and replica agreement.

``W`` ZMQ publishers in this process send vLLM-shaped batches (the payloads of
``bench/kv/ingest.py``: each stores one request's blocks; once a worker's simulated cache is
full, old blocks are removed). A relay process runs one :class:`~infera_nats.relay.KvRelay`
per publisher into a real ``nats-server -js``; a router process runs ``--replicas`` KV hubs
(two router replicas), each following every worker through its own
:class:`~infera_nats.kv_source.NatsKvSource`, exactly as ``serve --kv-event-transport nats``.

Reported:

* block events per CPU-second of the relay process and of one router replica (the router
  process's CPU divided by the replicas), i.e. events/s through JetStream per core;
* wall time from the first batch sent to the last one applied by every replica;
* agreement: while the events stream, every ``--sample-ms`` the router picks random
  lookups (prompts some worker stored), asks each replica for the best worker (longest
  cached prefix) and counts how often all replicas pick the same one among the lookups
  where some replica has a cached prefix; and the same once all events are applied.

    .venv/bin/python -m bench.kv.nats_events [--workers 4] [--batches 20000] [--rate 0] [--replicas 2]

``--rate`` limits the publishers to that many batches/s in all (0: as fast as possible,
the worst case for agreement: the replicas lag the stream the most).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from typing import Any

import msgspec
import psutil
import zmq

from bench.kv.ingest import make_payloads
from infera_core.util.nats_server import NatsServer
from infera_core.util.net import free_port

MODULE = "bench.kv.nats_events"  # this script, as its child processes run it: python -m MODULE

MODEL = "bench-model"


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def payloads_for(args: Any) -> tuple[list[tuple[int, bytes]], int]:
    return make_payloads(args.batches, args.blocks_per_store, args.block_size, args.capacity, args.workers)


# -- the relay process -------------------------------------------------------------------
async def relay_main(args: Any) -> None:
    from infera_nats.relay import KvRelay

    from infera_core.worker import KvEventsInfo

    relays = []
    for w, port in enumerate(args.ports):
        kv = KvEventsInfo(endpoint=f"tcp://127.0.0.1:{port}", format="vllm", block_size=args.block_size)
        relay = KvRelay(f"w{w}", MODEL, kv, args.nats)
        await relay.start()
        relays.append(relay)
    print("ready", flush=True)
    await asyncio.Event().wait()


# -- the router process ------------------------------------------------------------------
def lookups_for(args: Any) -> list[tuple[int, list[int]]]:
    """(worker, token ids) of every stored request, the prompts routers would see."""
    out = []
    for w, payload in payloads_for(args)[0]:
        _ts, events, _rank = msgspec.msgpack.decode(payload)
        for ev in events:
            if ev["type"] == "BlockStored":
                out.append((w, ev["token_ids"]))
    return out


async def router_main(args: Any) -> None:
    from infera_nats.kv_wire import kv_subject

    from infera_core.kv.hub import KvHub
    from infera_core.plugin.hooks import InferaHooks
    from infera_core.worker import KvEventsInfo, WorkerRecord

    os.environ["INFERA_NATS_URL"] = args.nats
    rng = random.Random(7)
    lookups = lookups_for(args)
    names = [f"w{w}" for w in range(args.workers)]
    final_seq = {f"w{w}": -1 for w in range(args.workers)}
    for w, _ in payloads_for(args)[0]:
        final_seq[f"w{w}"] += 1
    hubs = []
    for _ in range(args.replicas):
        hub = KvHub(InferaHooks.load().catalog())
        await hub.start()
        for w, name in enumerate(names):
            kv = KvEventsInfo(
                endpoint=f"tcp://127.0.0.1:{args.ports[w]}", format="vllm", block_size=args.block_size
            )
            hub.worker_added(
                WorkerRecord(
                    worker_id=name,
                    url="http://127.0.0.1:9",
                    model=MODEL,
                    engine="vllm",
                    kv_events=kv,
                    kv_event_transport="nats",
                    kv_event_params={"subject": kv_subject("infera", MODEL, name)},
                )
            )
        hubs.append(hub)

    def done() -> bool:
        return all(
            (sub := hub.subs.get(n)) and sub[0].last_seq == final_seq[n] for hub in hubs for n in names
        )

    def best(hub: KvHub, hashes: list[int]) -> str | None:
        scores = hub.index.match(hashes, [hub.index.view(n, None) for n in names])
        top = max(scores)
        return names[scores.index(top)] if top > 0 else None

    def sample(k: int) -> tuple[int, int]:
        agree = total = 0
        for _ in range(k):
            _w, toks = lookups[rng.randrange(len(lookups))]
            hashes = hubs[0].index.hash_prompt(toks, args.block_size)
            picks = {best(h, hashes) for h in hubs}
            if picks == {None}:
                continue  # no replica has it cached (evicted, or not arrived anywhere yet)
            total += 1
            agree += len(picks) == 1
        return agree, total

    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go"
    t0 = time.monotonic()
    live_agree = live_total = 0
    deadline = t0 + args.timeout
    while not done() and time.monotonic() < deadline:
        await asyncio.sleep(args.sample_ms / 1000)
        a, t = sample(args.sample_size)
        live_agree += a
        live_total += t
    elapsed = time.monotonic() - t0
    final_agree, final_total = sample(5000)
    stats = [
        {n: {k: hub.subs[n][0].summary()[k] for k in ("batches", "gaps", "replays_failed")} for n in names}
        for hub in hubs
    ]
    print(
        json.dumps(
            {
                "done": done(),
                "elapsed": elapsed,
                "live": [live_agree, live_total],
                "final": [final_agree, final_total],
                "blocks": [hub.index.block_count() for hub in hubs],
                "subs": stats,
            }
        ),
        flush=True,
    )
    for hub in hubs:
        await hub.close()


# -- the driver ---------------------------------------------------------------------------
def spawn(role: str, args: Any, nats_url: str, ports: list[int]) -> subprocess.Popen[str]:
    argv = [
        sys.executable,
        "-m",
        MODULE,
        "--role",
        role,
        "--nats",
        nats_url,
        "--ports",
        ",".join(map(str, ports)),
    ]
    for k in ("workers", "batches", "blocks_per_store", "block_size", "capacity", "replicas"):
        argv += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    argv += ["--sample-ms", str(args.sample_ms), "--sample-size", str(args.sample_size)]
    argv += ["--timeout", str(args.timeout)]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit(f"the {role} process did not start")
    return proc


def drive(args: Any) -> None:
    payloads, blocks = payloads_for(args)
    ports = [free_port() for _ in range(args.workers)]
    ctx = zmq.Context()
    pubs = []
    for p in ports:
        sock = ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(f"tcp://127.0.0.1:{p}")
        pubs.append(sock)
    nats = NatsServer()
    nats.start()
    procs: list[subprocess.Popen[str]] = []
    try:
        router = spawn("router", args, nats.url, ports)
        procs.append(router)
        relay = spawn("relay", args, nats.url, ports)
        procs.append(relay)
        time.sleep(0.5)  # the relays' SUB subscriptions reach the publishers
        cpu0 = {"relay": cpu_seconds(relay.pid), "router": cpu_seconds(router.pid)}
        assert router.stdin is not None and router.stdout is not None
        router.stdin.write("go\n")
        router.stdin.flush()
        seqs = [0] * args.workers
        t0 = time.monotonic()
        for i, (w, payload) in enumerate(payloads):
            pubs[w].send_multipart([b"kv-events", seqs[w].to_bytes(8, "big"), payload])
            seqs[w] += 1
            if args.rate:
                lag = t0 + (i + 1) / args.rate - time.monotonic()
                if lag > 0:
                    time.sleep(lag)
        sent = time.monotonic() - t0
        report = json.loads(router.stdout.readline())
        cpu = {k: cpu_seconds(p.pid) - cpu0[k] for k, p in (("relay", relay), ("router", router))}
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        nats.close()
        for s in pubs:
            s.close(0)
        ctx.term()
    per_replica = cpu["router"] / args.replicas
    live_a, live_t = report["live"]
    fin_a, fin_t = report["final"]
    mb = sum(len(p) for _, p in payloads) / 1e6
    print(
        f"{len(payloads)} batches ({blocks} block events, {mb:.1f} MB) from {args.workers} workers, "
        f"{args.replicas} router replicas; sent in {sent:.2f} s"
        + (f" (--rate {args.rate}/s)" if args.rate else " (as fast as possible)")
    )
    print(f"all applied by every replica: {report['done']} after {report['elapsed']:.2f} s")
    print("| part | CPU s | block events / CPU-s | batches / CPU-s |\n|---|---:|---:|---:|")
    for name, secs in (
        ("relay (ZMQ → JetStream)", cpu["relay"]),
        ("router replica (JetStream → index)", per_replica),
    ):
        print(f"| {name} | {secs:.2f} | {blocks / secs:,.0f} | {len(payloads) / secs:,.0f} |")
    print(
        f"best-worker agreement between replicas: live {live_a}/{live_t} = {100 * live_a / max(live_t, 1):.2f} %,"
        f" after the stream {fin_a}/{fin_t} = {100 * fin_a / max(fin_t, 1):.2f} % (cached-prefix lookups)"
    )
    gaps = sum(s["gaps"] for hub in report["subs"] for s in hub.values())
    if gaps:
        print(f"gaps seen by the replicas: {gaps}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batches", type=int, default=20000, help="batches in all, round-robin over workers")
    ap.add_argument("--blocks-per-store", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--capacity", type=int, default=20000, help="simulated cache size in blocks, per worker")
    ap.add_argument("--replicas", type=int, default=2, help="router replicas (KV hubs) in the router process")
    ap.add_argument("--rate", type=float, default=0, help="batches/s in all (0: as fast as possible)")
    ap.add_argument("--sample-ms", type=float, default=10, help="agreement sample interval while streaming")
    ap.add_argument("--sample-size", type=int, default=16, help="lookups per sample")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--role", choices=("relay", "router"), help=argparse.SUPPRESS)
    ap.add_argument("--nats", help=argparse.SUPPRESS)
    ap.add_argument("--ports", type=lambda s: [int(p) for p in s.split(",")], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "relay":
        import uvloop

        uvloop.run(relay_main(args))
    elif args.role == "router":
        import uvloop

        uvloop.run(router_main(args))
    else:
        drive(args)


if __name__ == "__main__":
    main()

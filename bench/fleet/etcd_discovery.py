"""etcd fleet benchmark: 1000 workers registered from one process against a real etcd.

Starts its own etcd (Debian ``etcd-server``) on a free loopback port, then:

1. registers ``--workers`` workers through one :class:`EtcdDiscovery` (one lease and one
   keepalive task each, ``--concurrency`` registrations at a time) while a second
   connection watches the prefix; reports registration throughput and watch propagation
   latency (from just before the put/txn is sent to a watcher in another process
   receiving the event; wall clock, same machine);
2. updates every record at ``--rate`` updates/s (what a drain looks like fleet-wide) and
   reports propagation latency p50/p99 again;
3. idles for ``--window`` seconds with every lease kept alive and reports keepalive cost:
   launcher CPU time per keepalive and per full round (all leases refreshed once), and
   what etcd sees (RPCs started/s, gRPC messages received/s, etcd CPU %).

Run: ``.venv/bin/python -m bench.fleet.etcd_discovery [--workers 1000] [--ttl 10] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any

import httpx
import psutil

from infera_core.discovery.base import ChangeKind, DiscoverySettings
from infera_core.discovery.etcd import EtcdDiscovery, EtcdRegistration
from infera_core.testing.etcd import EtcdServer
from infera_core.worker import WorkerRecord

MODULE = "bench.fleet.etcd_discovery"  # this script, as its child processes run it: python -m MODULE


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else float("nan")


def record(i: int, sent: float, status: str = "active") -> WorkerRecord:
    return WorkerRecord(
        worker_id=f"bench-{i:05d}",
        url=f"http://10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}:8000",
        model="bench-model",
        engine="sim",
        status=status,  # type: ignore[arg-type]
        labels={"sent": repr(sent)},
    )


def etcd_counters(server: EtcdServer) -> tuple[float, float]:
    """(gRPC calls started, gRPC messages received) since etcd started."""
    started = received = 0.0
    for line in httpx.get(f"{server.url}/metrics", timeout=5).text.splitlines():
        if line.startswith("grpc_server_started_total"):
            started += float(line.rsplit(" ", 1)[1])
        elif line.startswith("grpc_server_msg_received_total"):
            received += float(line.rsplit(" ", 1)[1])
    return started, received


async def watch_child(url: str) -> None:
    """``--watch-child URL``: print ``ready`` once watching, then one latency (s) per PUT."""
    disc = EtcdDiscovery(DiscoverySettings(etcd_endpoints=[url], connect_timeout=10))
    await disc.start()
    async for change in disc.watch(sync_marker=True):
        now = time.time()
        if change.kind is ChangeKind.SYNCED:
            print("ready", flush=True)
        elif change.kind is ChangeKind.PUT and change.record is not None and "sent" in change.record.labels:
            print(f"{now - float(change.record.labels['sent']):.6f}", flush=True)
        else:
            print("other", flush=True)


class Watcher:
    """A watcher in its own process (so the launcher side's load does not delay it);
    collects the propagation latency of every PUT carrying a ``sent`` label."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self.seen = 0
        self.changed = asyncio.Event()
        self.ready = asyncio.Event()
        self.proc: asyncio.subprocess.Process | None = None

    async def run(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", MODULE, "--watch-child", self.url, stdout=asyncio.subprocess.PIPE
        )
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode().strip()
            if line == "ready":
                self.ready.set()
                continue
            if line != "other":
                self.latencies.append(float(line))
            self.seen += 1
            self.changed.set()

    def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()

    async def wait_seen(self, n: int, within: float) -> None:
        async with asyncio.timeout(within):
            while self.seen < n:
                self.changed.clear()
                await self.changed.wait()


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    server = EtcdServer()
    server.start()
    try:
        settings = DiscoverySettings(etcd_endpoints=[server.url], lease_ttl=args.ttl, connect_timeout=10)
        launcher = EtcdDiscovery(settings)
        await launcher.start()
        watcher = Watcher(server.url)
        watch_task = asyncio.create_task(watcher.run())
        async with asyncio.timeout(30):
            await watcher.ready.wait()
        out: dict[str, Any] = {"workers": args.workers, "lease_ttl_s": args.ttl}

        # 1. registration burst
        regs: list[EtcdRegistration] = []
        gate = asyncio.Semaphore(args.concurrency)

        async def register(i: int) -> None:
            async with gate:
                regs.append(await launcher.register(record(i, time.time())))

        t0 = time.perf_counter()
        await asyncio.gather(*(register(i) for i in range(args.workers)))
        out["register_s"] = time.perf_counter() - t0
        await watcher.wait_seen(args.workers, within=60)
        out["register_per_s"] = args.workers / out["register_s"]
        burst = watcher.latencies[:]
        out["burst_watch_latency_ms"] = {"p50": pct(burst, 50) * 1e3, "p99": pct(burst, 99) * 1e3}

        # 2. paced updates (status draining), one every 1/rate s
        watcher.latencies.clear()
        seen_before = watcher.seen
        interval = 1.0 / args.rate
        t0 = time.perf_counter()
        for n, reg in enumerate(regs):
            delay = t0 + n * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            i = int(reg.record.worker_id.rsplit("-", 1)[1])
            await reg.update(record(i, time.time(), status="draining"))
        await watcher.wait_seen(seen_before + len(regs), within=60)
        paced = watcher.latencies[:]
        out["paced_rate_per_s"] = args.rate
        out["paced_watch_latency_ms"] = {"p50": pct(paced, 50) * 1e3, "p99": pct(paced, 99) * 1e3}

        # 3. keepalive cost while idle
        etcd_proc = psutil.Process(server.proc.pid) if server.proc else None
        await asyncio.sleep(args.ttl / 3)  # settle into the steady keepalive rhythm
        ka0 = sum(r.keepalives for r in regs)
        cpu0 = time.process_time()
        etcd_cpu0 = sum(etcd_proc.cpu_times()[:2]) if etcd_proc else 0.0
        calls0, msgs0 = etcd_counters(server)
        w0 = time.perf_counter()
        await asyncio.sleep(args.window)
        window = time.perf_counter() - w0
        ka = sum(r.keepalives for r in regs) - ka0
        cpu = time.process_time() - cpu0
        calls1, msgs1 = etcd_counters(server)
        etcd_cpu = (sum(etcd_proc.cpu_times()[:2]) - etcd_cpu0) if etcd_proc else float("nan")
        out["keepalive"] = {
            "window_s": window,
            "keepalives": ka,
            "keepalives_per_s": ka / window,
            "launcher_cpu_pct": 100 * cpu / window,
            "cpu_us_per_keepalive": 1e6 * cpu / ka if ka else float("nan"),
            "cpu_ms_per_round": 1e3 * cpu / ka * args.workers if ka else float("nan"),
            "etcd_rpcs_per_s": (calls1 - calls0) / window,
            "etcd_msgs_per_s": (msgs1 - msgs0) / window,
            "etcd_cpu_pct": 100 * etcd_cpu / window,
            "regrants": sum(r.regrants for r in regs),
        }
        t0 = time.perf_counter()
        await asyncio.gather(*(r.deregister() for r in regs))
        out["deregister_s"] = time.perf_counter() - t0
        watcher.stop()
        watch_task.cancel()
        await launcher.close()
        return out
    finally:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--ttl", type=float, default=10.0, help="lease TTL (keepalive every TTL/3)")
    parser.add_argument("--concurrency", type=int, default=64, help="registrations in flight")
    parser.add_argument("--rate", type=float, default=200.0, help="paced updates per second")
    parser.add_argument("--window", type=float, default=15.0, help="seconds of idle keepalive measured")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--watch-child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.watch_child:
        asyncio.run(watch_child(args.watch_child))
        return
    result = asyncio.run(bench(args))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    ka = result["keepalive"]
    print(f"etcd fleet benchmark: {args.workers} workers, one process, lease TTL {args.ttl:g}s")
    print(f"  register            {result['register_s']:.2f}s  ({result['register_per_s']:.0f}/s)")
    b, p = result["burst_watch_latency_ms"], result["paced_watch_latency_ms"]
    print(f"  watch latency burst p50 {b['p50']:.1f} ms  p99 {b['p99']:.1f} ms")
    print(f"  watch latency @{args.rate:g}/s p50 {p['p50']:.1f} ms  p99 {p['p99']:.1f} ms")
    print(
        f"  keepalive           {ka['keepalives_per_s']:.0f}/s, launcher CPU {ka['launcher_cpu_pct']:.1f}% "
        f"({ka['cpu_us_per_keepalive']:.0f} µs each, {ka['cpu_ms_per_round']:.0f} ms per round of {args.workers})"
    )
    print(
        f"  etcd                {ka['etcd_rpcs_per_s']:.0f} RPCs/s, {ka['etcd_msgs_per_s']:.0f} msgs/s, "
        f"CPU {ka['etcd_cpu_pct']:.1f}%  (regrants: {ka['regrants']})"
    )
    print(f"  deregister all      {result['deregister_s']:.2f}s")


if __name__ == "__main__":
    main()

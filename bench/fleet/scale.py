"""Fleet-scale simulation: routing over 64–256 sim workers on one machine.

Many sim engines run inside a few host processes (``infera_sim.server.create_app``
once per engine, each on its own HTTP and ZMQ ports; ``--speedup inf`` so nothing
sleeps), are registered in the embedded stack's discovery like launchers would
register them, and the bench (a separate ``infera-run bench`` process) drives a
workload through the router once per policy, on fresh engines each time. Reported
per policy: prefix-cache hit rate, TTFT/e2e, load spread, and the router's
routing-decision latency (``infera_routing_decision_seconds`` from its /metrics).

Run::

    .venv/bin/python -m bench.fleet.scale --workers 128 --policies round-robin,kv-aware \\
        --workload shared-prefix --groups 128 --questions-per-group 8
    .venv/bin/python -m bench.fleet.scale --workers 128 --workload trace \\
        --trace bench/data/mooncake_synthetic_trace.jsonl --time-scale 0.05 --max-requests 400

Extra ``infera-run bench`` flags go after ``--``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from infera_core.plugin.hooks import InferaHooks
from infera_core.up.settings import UpSettings
from infera_core.up.stack import Stack
from infera_core.worker import KvEventsInfo, WorkerRecord

MODULE = "bench.fleet.scale"  # this script, as its child processes run it: python -m MODULE

MODEL = "sim-model"


# -- host process: many sims in one event loop -------------------------------------------
async def _host(count: int, tag: str, engine_args: list[str]) -> None:
    from aiohttp import web
    from infera_sim.config import parse_args
    from infera_sim.server import SIM_KEY, create_app

    runners = []
    for i in range(count):
        cfg = parse_args(
            [
                "--port",
                "0",
                "--kv-events-port",
                "0",
                "--kv-replay-port",
                "0",
                "--model",
                MODEL,
                "--engine-id",
                f"{tag}-{i}",
                "--speedup",
                "inf",
                *engine_args,
            ]
        )
        app = create_app(cfg)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, cfg.host, 0, backlog=1024)
        await site.start()
        sim = app[SIM_KEY]
        sim.http_port = int(runner.addresses[0][1])
        info = sim.info()
        info["worker_id"] = f"sim-{tag}-{i}"
        print("SIM " + json.dumps(info), flush=True)
        runners.append(runner)
    print("HOST_READY", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for r in runners:
        with contextlib.suppress(Exception):
            await r.cleanup()


def _record(info: dict[str, Any]) -> WorkerRecord:
    return WorkerRecord(
        worker_id=info["worker_id"],
        url=f"http://127.0.0.1:{info['port']}",
        model=MODEL,
        engine="sim",
        kv_events=KvEventsInfo(
            endpoint=f"tcp://127.0.0.1:{info['kv_events_port']}",
            format="vllm",
            block_size=int(info["block_size"]),
            replay_endpoint=f"tcp://127.0.0.1:{info['kv_replay_port']}",
            fingerprint=info.get("fingerprint"),
        ),
        labels={"engine": "sim"},
    )


async def _start_hosts(
    workers: int, per_host: int, engine_args: list[str]
) -> tuple[list[Any], list[dict[str, Any]]]:
    procs = []
    infos: list[dict[str, Any]] = []
    n_hosts = (workers + per_host - 1) // per_host
    for h in range(n_hosts):
        count = min(per_host, workers - h * per_host)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            MODULE,
            "--host-child",
            str(count),
            "--tag",
            f"h{h}",
            "--engine-args",
            shlex.join(engine_args),
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        procs.append(proc)
    for proc in procs:
        assert proc.stdout is not None
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
            if not line:
                raise RuntimeError("a sim host process exited during start-up")
            if line.startswith("SIM "):
                infos.append(json.loads(line[4:]))
            elif line.startswith("HOST_READY"):
                break
    return procs, infos


async def _stop_hosts(procs: list[Any]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            await asyncio.wait_for(p.wait(), 15)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            await p.wait()


async def _one_policy(
    args: argparse.Namespace, policy: str, bench_args: list[str], out: Path
) -> dict[str, Any]:
    hooks = InferaHooks.load()
    t = time.perf_counter()
    procs, infos = await _start_hosts(args.workers, args.per_host, shlex.split(args.engine_args))
    started = time.perf_counter() - t
    try:
        up = UpSettings(workers=0, policy=policy, port=0, quiet=True)
        async with Stack(up, hooks) as stack:
            assert stack.discovery is not None
            for info in infos:
                await stack.discovery.register(_record(info))
            await stack.wait_routable(len(infos), 60)
            await asyncio.sleep(args.settle)  # KV subscriptions connect
            json_out = out / f"{policy}.json"
            cmd = [
                sys.executable,
                "-m",
                "infera_core",
                "bench",
                "--url",
                stack.url,
                "--model",
                MODEL,
                "--json",
                str(json_out),
                "--quiet",
                *bench_args,
            ]
            t = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE)
            stdout, _ = await proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"bench failed for {policy}:\n{stdout.decode()[-2000:]}")
            print(stdout.decode())
            data = json.loads(json_out.read_text())
            run = data["runs"][0]
            run["bench_wall_s"] = time.perf_counter() - t
            run["hosts_start_s"] = started
            return dict(run)
    finally:
        await _stop_hosts(procs)


def _bound(le: float | None) -> str:
    """A histogram bucket bound as text: ``≤250 µs``, or ``>10 ms`` past the last bucket."""
    if le is None:
        return "-"
    if le == float("inf"):
        return ">10 ms"
    return f"≤{le * 1e6:.0f} µs"


def _row(policy: str, run: dict[str, Any]) -> str:
    s = run["summary"]
    rtr: dict[str, Any] = next(iter(run.get("router", {}).values()), {})
    hit = s.get("prefix_cache_hit_rate")
    loads = [v for v in (s.get("requests_per_worker") or {}).values() if v]
    imb = max(loads) / (sum(loads) / len(loads)) if loads else float("nan")

    def ms(k: str, p: str) -> str:
        v = s[k].get(p)
        return f"{v * 1000:.0f}" if v is not None else "-"

    dec = "-"
    if rtr:
        dec = f"{rtr['mean_s'] * 1e6:.0f} µs (p50 {_bound(rtr['p50_le_s'])}, p99 {_bound(rtr['p99_le_s'])})"
    cells = [
        policy,
        f"{s['completed']}/{s['requests']}",
        f"{hit:.1%}" if hit is not None else "-",
        ms("ttft_s", "p50"),
        ms("ttft_s", "p90"),
        ms("e2e_s", "p50"),
        f"{s['requests_per_s']:.0f}",
        str(len(loads)),
        f"{imb:.2f}",
        dec,
    ]
    return "| " + " | ".join(cells) + " |"


async def _main(args: argparse.Namespace, bench_args: list[str], out: Path) -> None:
    rows = []
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        run = await _one_policy(args, policy, bench_args, out)
        rows.append(_row(policy, run))
        print(
            f"{policy}: done ({run['hosts_start_s']:.1f}s to start {args.workers} sims, bench {run['bench_wall_s']:.1f}s)"
        )
    print(
        f"\n{args.workers} sim workers in {(args.workers + args.per_host - 1) // args.per_host} host processes; bench: {' '.join(bench_args)}\n"
    )
    print(
        "| policy | ok | hit rate | TTFT p50 ms | TTFT p90 ms | e2e p50 ms | req/s | workers used | max/mean | routing decision |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(r)
    print(f"\nper-policy JSON in {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=128, help="sim workers in the fleet")
    p.add_argument("--per-host", type=int, default=64, help="sim engines per host process")
    p.add_argument("--policies", default="round-robin,kv-aware", help="comma list of routing presets")
    p.add_argument("--engine-args", default="--cache-blocks 2048", help="extra sim flags (one string)")
    p.add_argument("--settle", type=float, default=1.0, help="seconds for KV subscriptions to connect")
    p.add_argument("--out", default=None, help="directory for per-policy JSON results")
    p.add_argument("--host-child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--tag", default="h0", help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    args, bench_args = p.parse_known_args(argv)
    bench_args += extra
    if args.host_child is not None:
        try:
            import uvloop

            uvloop.run(_host(args.host_child, args.tag, shlex.split(args.engine_args)))
        except ImportError:
            asyncio.run(_host(args.host_child, args.tag, shlex.split(args.engine_args)))
        return
    out = Path(args.out or tempfile.mkdtemp(prefix="infera-fleet-"))
    out.mkdir(parents=True, exist_ok=True)
    asyncio.run(_main(args, bench_args, out))


if __name__ == "__main__":
    main()

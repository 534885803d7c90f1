"""Proxy overhead on loopback: direct vs Infera vs sglang-router, in one run.

Two fast fake upstreams (``infera_core.testing.upstream.FakeUpstream`` on uvloop, in
their own process) serve non-streaming JSON and 64-chunk SSE streams. The same
closed-loop load (aiohttp client, uvloop, concurrency 1/16/64) goes

* direct to the upstreams (round robin in the client),
* through ``infera-run serve`` (static fleet, ``--router-policy round-robin``), once per
  ``--upstream-transport`` (``infera`` = native, ``infera-aiohttp`` = aiohttp; ``--transports``),
  and with ``nats`` in ``--transports`` over the NATS request transport (``infera-nats``: a
  ``nats-server`` and one responder per upstream in their own process; the fleet's records
  say ``request_transport: nats``),
* through ``sglang-router`` (``python -m sglang_router.launch_router --policy round_robin``),
  when it is installed (``uv pip install sglang-router``).

Reported per case: requests/s, p50/p99 latency, latency added over direct, and the
router's CPU per request (utime+stime of the router process and its children from
``/proc``, delta over the run / requests), and per case each Infera variant's CPU per
request over sglang-router's and over the native HTTP hop's.

    .venv/bin/python -m bench.router.proxy_overhead [--requests 2000] [--concurrency 1,16,64] [--router-nice -10]
        [--transports native,aiohttp,nats] [--skip-sglang] [--api-keys] [--processes 1,2]
        [--chunk-interval-ms 5] [--chunks 64] [--sglang-python /path/to/venv/bin/python]

``--processes 1,2`` runs each Infera variant once per ``serve --processes`` value (targets
``infera``, ``infera-p2``…; default 1) and adds each one's req/s over the one-process run.
Every row also says what the fake upstreams and the load generator cost (their CPU per
request): on a small machine all three share the cores the router would scale onto. The
last table turns those into a ceiling per case (see ``ceilings``): the req/s the whole
stack could reach on this machine's cores with 1 and with N router processes, their ratio
(what ``--processes N`` can gain here at best), the measured ratio against it, and the cores
the stack actually got.

``--chunk-interval-ms 5`` paces the streams: the fake upstreams sleep that long before
each chunk, so every chunk reaches the router alone (as from a real engine at ~200
tokens/s) and costs it one upstream read wake-up and one client write — the unpaced
default sends a stream's chunks back to back, where the router reads many per wake-up.
Paced runs measure only streams (``--chunks`` per stream, default 64) and add each
router's CPU per chunk; give them more concurrency and fewer requests, e.g.
``--chunk-interval-ms 5 --concurrency 16,64 --requests 800``. ``--sglang-python`` runs
sglang-router from another interpreter (a venv where it is installed).

``--api-keys`` runs every Infera router with ``--api-key-file`` (one key, budgets too large
to bite) and sends the key with every request: compare a run with and without it.

On a shared machine, latency at low concurrency is dominated by how soon the router
process gets a core after each wake-up; ``--router-nice`` gives both routers the same
higher priority so the comparison measures the proxies rather than the neighbours.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import psutil
import yaml

from bench.router.proxy_report import Result, Row, table
from infera_core.util.net import free_port, stop_groups

MODULE = "bench.router.proxy_overhead"  # this script, as its child processes run it: python -m MODULE

MODEL = "fake-model"
BODY = b'{"model": "fake-model", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 64}'
STREAM_BODY = BODY[:-1] + b', "stream": true}'
API_KEY = "sk-bench-proxy-overhead"
CLIENT_HEADERS: dict[str, str] = {}
"""Sent with every request (``--api-keys``: the bench key; direct upstreams ignore it)."""
SERVE_FLAGS: list[str] = []
"""Extra ``infera-run serve`` flags (``--api-keys``: ``--api-key-file``)."""
UPSTREAM_PID: list[int] = []
STREAM_MODE: list[str] = ["stream-64"]
"""The stream rows' mode label (``stream-N``, ``stream-N@Xms`` when paced)."""
"""The fake upstreams' process (its CPU per request is reported with every row)."""
MODES: list[bool] = [False, True]
"""Which cases run: non-streaming (False) and streaming (True); paced runs only stream."""
STREAM_CHUNKS: list[int] = [64]
"""Data chunks per stream (``--chunks``): router CPU per chunk is its CPU per stream over this."""


def write_key_file(tmp: Path) -> Path:
    """One key with budgets too large to bite, so the budget code runs on every request."""
    path = tmp / "keys.yaml"
    key = {"name": "bench", "key": API_KEY, "requests_per_minute": 10**9, "tokens_per_day": 10**15}
    path.write_text(yaml.safe_dump({"keys": [key]}))
    return path


# -- the fake upstream process ---------------------------------------------------------
def serve_upstreams(ports: list[int], chunks: int = 64, interval_ms: float = 0.0) -> None:
    import uvloop

    from infera_core.testing.upstream import FakeUpstream

    async def main() -> None:
        ups = [FakeUpstream(f"up{i}", MODEL, chunks=chunks) for i in range(len(ports))]
        for u, p in zip(ups, ports, strict=True):
            u.chunk_delay = interval_ms / 1e3
            await u.start(p)
        print("ready", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


def serve_responders(nats_url: str, ports: list[int]) -> None:
    """One NATS responder per upstream (the worker side of ``--request-transport nats``)."""
    import uvloop
    from infera_nats.responder import Responder

    async def main() -> None:
        for i, p in enumerate(ports):
            await Responder(f"up{i}", f"http://127.0.0.1:{p}", nats_url).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


@contextlib.contextmanager
def nats_plane(ports: list[int]) -> Iterator[str]:
    """A ``nats-server`` and the upstreams' responders, until the block exits; yields the URL."""
    from infera_core.util.nats_server import NatsServer

    server = NatsServer()
    server.start()
    argv = [sys.executable, "-m", MODULE, "--serve-responders", server.url, ",".join(map(str, ports))]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("the NATS responders did not start")
        yield server.url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        server.close()


# -- helpers ---------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """utime+stime of ``pid`` and all its live descendants (from /proc)."""
    total = 0.0
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for p in procs:
        try:
            fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError):
            pass
    return total


def has_sglang(python: str) -> bool:
    """Whether ``python`` can import sglang_router."""
    if python == sys.executable:
        return importlib.util.find_spec("sglang_router") is not None
    probe = subprocess.run([python, "-c", "import sglang_router"], capture_output=True, check=False)
    return probe.returncode == 0


def wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s")


@contextlib.contextmanager
def process(
    argv: list[str], ready_url: str, timeout: float = 90, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, **env} if env else None,
    )
    try:
        wait_http(ready_url, timeout, proc)
        yield proc
    except Exception:
        if proc.poll() is not None and proc.stderr is not None:
            sys.stderr.write(proc.stderr.read().decode(errors="replace")[-3000:])
        raise
    finally:
        stop_groups([proc], grace=10, sig=signal.SIGINT)


# -- the load generator ----------------------------------------------------------------
async def _load(urls: list[str], body: bytes, stream: bool, concurrency: int, total: int) -> Result:
    connector = aiohttp.TCPConnector(limit=0)
    lat: list[float] = []
    errors = 0
    counter = iter(range(total))
    headers = {"Content-Type": "application/json", **CLIENT_HEADERS}
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(url: str) -> None:
            nonlocal errors
            t0 = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as resp:
                if stream:
                    async for _ in resp.content.iter_any():
                        pass
                else:
                    await resp.read()
                if resp.status != 200:
                    errors += 1
            lat.append(time.perf_counter() - t0)

        async def worker(k: int) -> None:
            for i in counter:
                await one(urls[(i + k) % len(urls)])

        # warm the connections
        await asyncio.gather(*[one(urls[k % len(urls)]) for k in range(concurrency)])
        lat.clear()
        t0 = time.perf_counter()
        await asyncio.gather(*[worker(k) for k in range(concurrency)])
        elapsed = time.perf_counter() - t0
    lat.sort()
    return Result(
        rps=len(lat) / elapsed,
        p50=statistics.median(lat),
        p99=lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        errors=errors,
    )


def run_load(urls: list[str], stream: bool, concurrency: int, total: int) -> Result:
    import uvloop

    body = STREAM_BODY if stream else BODY
    return uvloop.run(_load(urls, body, stream, concurrency, total))


# -- the benchmark ---------------------------------------------------------------------
def measure(
    target: str, urls: list[str], pid: int | None, concurrencies: list[int], total: int, rows: list[Row]
) -> None:
    for stream in MODES:
        for c in concurrencies:
            n = total if not stream else max(total // 2, c * 4)
            cpu0 = cpu_seconds(pid) if pid else 0.0
            up0 = [cpu_seconds(p) for p in UPSTREAM_PID]
            me0 = time.process_time()
            res = run_load(urls, stream, c, n)
            cpu = (cpu_seconds(pid) - cpu0) / n * 1e6 if pid else None
            up = sum(cpu_seconds(p) - u for p, u in zip(UPSTREAM_PID, up0, strict=True)) / n * 1e6
            me = (time.process_time() - me0) / n * 1e6
            rows.append(Row(target, STREAM_MODE[0] if stream else "json", c, res, cpu, up, me))
            print(
                f"  {target:14s} {'stream' if stream else 'json':6s} c={c:<3d} {res.rps:8.0f} req/s "
                f"p50 {res.p50 * 1e3:7.2f} ms p99 {res.p99 * 1e3:7.2f} ms"
                + (f" cpu {cpu:6.0f} µs/req" if cpu is not None else "")
                + (f" {cpu / STREAM_CHUNKS[0]:5.1f} µs/chunk" if cpu is not None and stream else "")
                + f" upstreams {up:4.0f} client {me:4.0f} µs/req"
                + (f" errors {res.errors}" if res.errors else ""),
                file=sys.stderr,
                flush=True,
            )


def measure_nats(
    nats_url: str,
    up_urls: list[str],
    tmp: Path,
    nice: list[str],
    concurrencies: list[int],
    total: int,
    rows: list[Row],
) -> None:
    """The router with the same fleet reached over NATS (target ``infera-nats``)."""
    from infera_nats.transport_wire import request_subject

    fleet = tmp / "fleet-nats.yaml"
    workers = [
        {
            "worker_id": f"up{i}",
            "url": u,
            "model": MODEL,
            "engine": "fake",
            "request_transport": "nats",
            "request_params": {"subject": request_subject("infera", f"up{i}")},
        }
        for i, u in enumerate(up_urls)
    ]
    fleet.write_text(yaml.safe_dump({"workers": workers}))
    port = free_port()
    argv = [*nice, str(Path(sys.executable).with_name("infera-run")), "--log-level", "warning", "serve"]
    argv += ["--port", str(port), "--request-transport", "nats", "--processes", "1"]
    argv += ["--discovery", "static", "--static-file", str(fleet), "--router-policy", "round-robin"]
    argv += SERVE_FLAGS
    with process(argv, f"http://127.0.0.1:{port}/health", env={"INFERA_NATS_URL": nats_url}) as proc:
        print("infera-nats", file=sys.stderr)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        measure("infera-nats", [url], proc.pid, concurrencies, total, rows)


def measure_serve(
    target: str,
    transport: str,
    procs: int,
    fleet: Path,
    nice: list[str],
    concurrencies: list[int],
    total: int,
    rows: list[Row],
) -> None:
    """``infera-run serve --processes procs`` over the static fleet (HTTP upstreams)."""
    port = free_port()
    argv = [*nice, str(Path(sys.executable).with_name("infera-run")), "--log-level", "warning", "serve"]
    argv += ["--port", str(port), "--upstream-transport", transport, "--processes", str(procs)]
    argv += ["--discovery", "static", "--static-file", str(fleet), "--router-policy", "round-robin"]
    argv += SERVE_FLAGS
    with process(argv, f"http://127.0.0.1:{port}/health") as proc:
        if procs > 1:  # /health answers once process 0 serves; the load's connections must reach all
            wait_processes(f"http://127.0.0.1:{port}", procs)
        print(target, file=sys.stderr)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        measure(target, [url], proc.pid, concurrencies, total, rows)


def wait_processes(url: str, count: int, timeout: float = 60) -> None:
    """Until ``count`` server processes answer (``GET /v1/admin/processes``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            if len(httpx.get(url + "/v1/admin/processes", timeout=2).json()["data"]) == count:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{count} server processes not up after {timeout}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="requests per case (streams: half)")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--skip-sglang", action="store_true")
    ap.add_argument(
        "--transports",
        default="native,aiohttp",
        help="Infera's --upstream-transport values to measure, in order (comma list)",
    )
    ap.add_argument(
        "--router-nice",
        type=int,
        default=0,
        help="run both routers under `nice -n N` (e.g. -10 on a shared, busy machine; same for both)",
    )
    ap.add_argument(
        "--api-keys",
        action="store_true",
        help="run Infera with --api-key-file (one key, budgets that never bite); every request sends the key",
    )
    ap.add_argument(
        "--processes",
        default="1",
        help="`serve --processes` values to run each Infera variant with (comma list, e.g. 1,2)",
    )
    ap.add_argument(
        "--chunk-interval-ms",
        type=float,
        default=0.0,
        help="pace the fake upstreams' streams: sleep this long before each chunk (streams only)",
    )
    ap.add_argument("--chunks", type=int, default=64, help="data chunks per stream (default 64)")
    ap.add_argument(
        "--sglang-python",
        default=sys.executable,
        help="an interpreter with sglang-router (default: this one)",
    )
    ap.add_argument("--serve-upstreams", help=argparse.SUPPRESS)
    ap.add_argument("--serve-responders", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_upstreams:
        serve_upstreams(
            [int(p) for p in args.serve_upstreams.split(",")], args.chunks, args.chunk_interval_ms
        )
        return
    if args.serve_responders:
        url, ports_arg = args.serve_responders
        serve_responders(url, [int(p) for p in ports_arg.split(",")])
        return
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    STREAM_CHUNKS[0] = args.chunks
    STREAM_MODE[0] = f"stream-{args.chunks}"
    if args.chunk_interval_ms:
        MODES[:] = [True]
        STREAM_MODE[0] += f"@{args.chunk_interval_ms:g}ms"
    pace = ["--chunks", str(args.chunks), "--chunk-interval-ms", str(args.chunk_interval_ms)]
    ports = [free_port(), free_port()]
    up_urls = [f"http://127.0.0.1:{p}" for p in ports]
    rows: list[Row] = []
    py = sys.executable
    nice = ["nice", "-n", str(args.router_nice)] if args.router_nice else []
    with (
        process(
            [py, "-m", MODULE, "--serve-upstreams", ",".join(map(str, ports)), *pace], up_urls[0] + "/health"
        ) as ups,
        tempfile.TemporaryDirectory() as tmp,
    ):
        UPSTREAM_PID.append(ups.pid)
        if args.api_keys:
            CLIENT_HEADERS["Authorization"] = f"Bearer {API_KEY}"
            SERVE_FLAGS.extend(["--api-key-file", str(write_key_file(Path(tmp)))])
        print("direct", file=sys.stderr)
        measure(
            "direct", [u + "/v1/chat/completions" for u in up_urls], None, concurrencies, args.requests, rows
        )

        fleet = Path(tmp) / "fleet.yaml"
        workers = [
            {"worker_id": f"up{i}", "url": u, "model": MODEL, "engine": "fake"} for i, u in enumerate(up_urls)
        ]
        fleet.write_text(yaml.safe_dump({"workers": workers}))
        for transport in args.transports.split(","):
            if transport == "nats":
                with nats_plane(ports) as nats_url:
                    measure_nats(nats_url, up_urls, Path(tmp), nice, concurrencies, args.requests, rows)
                continue
            for procs in [int(p) for p in args.processes.split(",")]:
                base = "infera" if transport == "native" else f"infera-{transport}"
                target = base if procs == 1 else f"{base}-p{procs}"
                measure_serve(target, transport, procs, fleet, nice, concurrencies, args.requests, rows)

        if not args.skip_sglang and has_sglang(args.sglang_python):
            port = free_port()
            argv = [
                *nice,
                args.sglang_python,
                "-m",
                "sglang_router.launch_router",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ]
            argv += ["--worker-urls", *up_urls, "--policy", "round_robin", "--log-level", "warn"]
            argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
            with process(argv, f"http://127.0.0.1:{port}/health") as proc:
                print("sglang-router", file=sys.stderr)
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                measure("sglang-router", [url], proc.pid, concurrencies, args.requests, rows)
        elif not args.skip_sglang:
            print(
                f"sglang-router is not importable from {args.sglang_python} (uv pip install sglang-router):"
                " skipped",
                file=sys.stderr,
            )
    print(table(rows, STREAM_CHUNKS[0]))


if __name__ == "__main__":
    main()

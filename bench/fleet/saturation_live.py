"""Saturation on the wall clock: the real routers in front of the same real sim processes.

The cross-check of ``bench/fleet/saturation.py`` (virtual time, in-process sims, sglang-router's
``cache_aware`` re-implemented): here every piece is the real process. ``--sims`` sim
servers (``python -m infera_sim.server``: its scheduler, prefix cache with LRU eviction,
timing model and ZMQ KV events) are started, then one router in front of them:

* ``kv-aware``, ``round-robin`` (any preset): ``infera-run serve --router-policy NAME``
  over a static fleet file whose records name each sim's KV event and replay sockets;
* ``sglang-cache-aware``: the real sglang-router (``python -m sglang_router.launch_router
  --policy cache_aware``, its defaults), from ``--sglang-python`` (an interpreter where
  ``uv pip install sglang-router`` put it; skipped when it has none).

An open-loop HTTP client (aiohttp) replays the same Mooncake rows as saturation.py
(its ``load_trace``: trace blocks scaled to ``--tokens-per-block`` tokens, outputs ÷ 4)
at the rows' arrival times ÷ ``--speedup``, streaming ``/v1/completions``; TTFT is the
client's time to the first chunk. The sims restart (empty caches) before each router.

Time: the sims run ``--sim-speedup`` times as fast as their timing model (0.1: ten times
slower), so a loaded 2-core machine can keep up; the trace is replayed ``--speedup`` times
faster than recorded *in the sims' time*, the same load as ``saturation.py --speedup``.
TTFTs are reported in the sims' seconds (client wall seconds × ``--sim-speedup``), which
also shrinks the routers' own latency by that factor.

Prompts: sglang-router 0.3 refuses token-id prompts on ``/v1/completions`` ("prompt: data
did not match any variant of untagged enum StringOrArray"), so every router gets the same
text: one word ``" w<id>"`` per token id, which the sim tokenizer (and Infera's, named by
the sims' fingerprint) turns into one token each, after its BOS; prompts that share trace
blocks share their token prefix exactly as the token-id prompts do.

Hit fraction: the sims' own counters, ``vllm:prefix_cache_hits_total`` /
``vllm:prefix_cache_queries_total`` summed over the sims. Pooled bound: saturation.py's
``pooled_bound`` (one LRU of the whole fleet's blocks) over the prompts as the sims
tokenize them. Router CPU: utime + stime of the router's processes over the replay, per
request, and split by thread kind (event loop, other threads, libzmq I/O).

    .venv/bin/python -m bench.fleet.saturation_live [--rows 1000] [--skip 2000] [--speedup 36]
        [--sim-speedup 0.1] [--routers kv-aware,round-robin,sglang-cache-aware]
        [--sglang-python /path/to/venv/bin/python] [--virtual]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import psutil
import yaml
from infera_sim.tokenizer import SimTokenizer

from bench.fleet.saturation import SGLANG, Arrival, load_trace, pooled_bound, print_ratios, registry, run
from bench.router.proxy_overhead import cpu_seconds, process
from bench.traces import MOONCAKE_TRACE
from infera_core.util.net import free_port, stop_groups
from infera_core.worker import KvEventsInfo, WorkerRecord

MODEL = "m"
BS = 16


def prompt_text(tokens: list[int]) -> str:
    """One word per token id; the sim tokenizer encodes it as BOS + one id per word."""
    return "".join(f" w{t}" for t in tokens)


@dataclass(slots=True)
class Sim:
    proc: subprocess.Popen[bytes]
    info: dict[str, Any]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.info['port']}"

    def record(self) -> WorkerRecord:
        return WorkerRecord(
            worker_id=f"sim{self.info['engine_id']}",
            url=self.url,
            model=MODEL,
            engine="sim",
            kv_events=KvEventsInfo(
                endpoint=f"tcp://127.0.0.1:{self.info['kv_events_port']}",
                format="vllm",
                block_size=BS,
                replay_endpoint=f"tcp://127.0.0.1:{self.info['kv_replay_port']}",
                fingerprint=self.info.get("fingerprint"),
            ),
        )


@contextlib.contextmanager
def sims(args: argparse.Namespace, logs: Path) -> Iterator[list[Sim]]:
    """``--sims`` fresh sim server processes (empty caches), until the block exits."""
    argv = [sys.executable, "-m", "infera_sim.server", "--port", "0", "--model", MODEL]
    argv += ["--kv-events-port", "0", "--kv-replay-port", "0", "--block-size", str(BS)]
    argv += ["--cache-blocks", str(args.blocks), "--max-model-len", str(1 << 20)]
    argv += ["--speedup", str(args.sim_speedup)]
    started: list[tuple[subprocess.Popen[bytes], Path]] = []
    out: list[Sim] = []
    try:
        for i in range(args.sims):
            path = logs / f"sim{i}.out"
            with path.open("wb") as fh:
                rate = args.prefill_rate * (getattr(args, "fast", 1.0) if i % 2 else 1.0)
                proc = subprocess.Popen(
                    [*argv, "--engine-id", str(i), "--prefill-tokens-per-s", str(rate)],
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            started.append((proc, path))
        deadline = time.monotonic() + 120
        for proc, path in started:
            while True:
                line = next(
                    (x for x in path.read_text().splitlines() if x.startswith("INFERA_SIM_READY ")), ""
                )
                if line:
                    out.append(Sim(proc, json.loads(line.split(" ", 1)[1])))
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"a sim did not start:\n{path.read_text()[-2000:]}")
                time.sleep(0.1)
        yield out
    finally:
        stop_groups([proc for proc, _ in started], grace=15)


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of ``pid``'s process tree by thread kind (``/proc/*/task``): ``loop`` (each
    process's main thread: the event loop), ``zmq`` (libzmq's I/O threads) and ``threads`` (the
    rest: Infera's ``kv-ingest`` loop, tokenizer pool; sglang-router's tokio workers)."""
    out = {"loop": 0.0, "zmq": 0.0, "threads": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for p in procs:
        for task in Path(f"/proc/{p.pid}/task").glob("*"):
            try:
                comm = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            kind = "loop" if task.name == str(p.pid) else "zmq" if comm.startswith("ZMQbg") else "threads"
            out[kind] += (int(fields[11]) + int(fields[12])) / tick
    return out


def sim_counters(fleet: list[Sim]) -> dict[str, float]:
    """Prefix-cache hits and queries (tokens) and preemptions, summed over the sims' /metrics."""
    names = {
        "vllm:prefix_cache_hits_total": "hits",
        "vllm:prefix_cache_queries_total": "queries",
        "vllm:num_preemptions_total": "preemptions",
    }
    out = dict.fromkeys(names.values(), 0.0)
    out["odd_prefill"] = 0.0
    for i, s in enumerate(fleet):
        mine = dict.fromkeys(names.values(), 0.0)
        for line in httpx.get(s.url + "/metrics", timeout=10).text.splitlines():
            name = line.split("{", 1)[0]
            if name in names:
                mine[names[name]] += float(line.rsplit(" ", 1)[1])
        for k, v in mine.items():
            out[k] += v
        if i % 2:  # the fast sims under --fast: their share of the prefill (uncached) tokens
            out["odd_prefill"] += mine["queries"] - mine["hits"]
    return out


# -- the routers ---------------------------------------------------------------------------
@contextlib.contextmanager
def router(name: str, fleet: list[Sim], args: argparse.Namespace, tmp: Path) -> Iterator[tuple[str, int]]:
    """The router ``name`` in front of ``fleet``; yields (base URL, pid)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    if name == SGLANG:
        argv = [args.sglang_python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--worker-urls", *[s.url for s in fleet]]
        argv += ["--policy", "cache_aware", "--log-level", "warn"]
        # its metrics exporter binds a fixed port (29000) unless told otherwise
        argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        with process(argv, base + "/health") as proc:
            wait_sglang_workers(base, len(fleet))
            yield base, proc.pid
        return
    static = tmp / "fleet.yaml"
    static.write_text(yaml.safe_dump({"workers": [s.record().model_dump(mode="json") for s in fleet]}))
    argv = [str(Path(sys.executable).with_name("infera-run")), "--log-level", "warning", "serve"]
    argv += ["--port", str(port), "--processes", "1", "--discovery", "static"]
    argv += ["--static-file", str(static), "--router-policy", name]
    with process(argv, base + "/health") as proc:
        wait_infera_workers(base, len(fleet))
        yield base, proc.pid


def wait_infera_workers(base: str, count: int, timeout: float = 60) -> None:
    """Until ``/v1/workers`` lists every sim."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            if len(httpx.get(base + "/v1/workers", timeout=2).json()["data"]) >= count:
                return
        time.sleep(0.2)
    raise TimeoutError(f"infera-run serve did not list {count} workers after {timeout}s")


def wait_sglang_workers(base: str, count: int, timeout: float = 60) -> None:
    """Until sglang-router registered every worker (it adds them in the background)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError, TypeError):
            data = httpx.get(base + "/workers", timeout=2).json()
            workers = data.get("workers", data) if isinstance(data, dict) else data
            if len(workers) >= count:
                return
        time.sleep(0.2)
    raise TimeoutError(f"sglang-router did not register {count} workers after {timeout}s")


def has_sglang(python: str) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec("sglang_router") is not None
    probe = subprocess.run([python, "-c", "import sglang_router"], capture_output=True, check=False)
    return probe.returncode == 0


# -- the load ------------------------------------------------------------------------------
@dataclass
class Replay:
    ttft: list[float] = field(default_factory=list)
    """Client seconds from sending to the first chunk."""
    late: list[float] = field(default_factory=list)
    """How late each request left, against its scheduled time (the client's own lag)."""
    errors: int = 0
    wall: float = 0.0


async def replay(url: str, arrivals: list[Arrival], texts: list[str], sim_speedup: float) -> Replay:
    out = Replay()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        t0 = loop.time() + 0.5

        async def one(a: Arrival, text: str) -> None:
            at = t0 + a.t / sim_speedup
            await asyncio.sleep(max(0.0, at - loop.time()))
            body = {"model": MODEL, "prompt": text, "max_tokens": a.max_tokens, "stream": True}
            body["ignore_eos"] = True
            sent = loop.time()
            out.late.append(sent - at)
            first: float | None = None
            try:
                async with session.post(url, json=body) as resp:
                    async for chunk in resp.content.iter_any():
                        if first is None and chunk.strip():
                            first = loop.time()
                    if resp.status != 200:
                        out.errors += 1
                        return
            except aiohttp.ClientError:
                out.errors += 1
                return
            out.ttft.append((first or loop.time()) - sent)

        await asyncio.gather(*(one(a, t) for a, t in zip(arrivals, texts, strict=True)))
        out.wall = loop.time() - t0
    return out


def run_live(
    name: str, arrivals: list[Arrival], texts: list[str], args: argparse.Namespace, tmp: Path
) -> dict[str, float]:
    import uvloop

    with sims(args, tmp) as fleet, router(name, fleet, args, tmp) as (base, pid):
        cpu0, split0 = cpu_seconds(pid), thread_cpu(pid)
        res = uvloop.run(replay(base + "/v1/completions", arrivals, texts, args.sim_speedup))
        cpu = cpu_seconds(pid) - cpu0
        split = {k: (v - split0[k]) / len(arrivals) * 1e3 for k, v in thread_cpu(pid).items()}
        c = sim_counters(fleet)
    if not res.ttft:
        raise RuntimeError(f"{name}: every request failed")
    q = statistics.quantiles([x * args.sim_speedup for x in res.ttft], n=100)
    late = sorted(res.late)
    return {
        "ttft_p50": q[49],
        "ttft_p90": q[89],
        "ttft_p99": q[98],
        "hit": c["hits"] / max(1.0, c["queries"]),
        "fast_share": c["odd_prefill"] / max(1.0, c["queries"] - c["hits"]),
        "preemptions": c["preemptions"],
        "errors": float(res.errors),
        "late_p99_ms": late[int(len(late) * 0.99)] * 1e3,
        "router_cpu_ms": cpu / len(arrivals) * 1e3,
        **{f"cpu_{k}_ms": v for k, v in split.items()},
        "wall": res.wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--trace", default=str(MOONCAKE_TRACE), help="a Mooncake JSONL trace (default: the shipped one)"
    )
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--skip", type=int, default=2000, help="start at this row of the trace")
    ap.add_argument("--speedup", type=float, default=36.0, help="trace time / replay time, in the sims' time")
    ap.add_argument(
        "--sim-speedup",
        type=float,
        default=0.1,
        help="the sims' --speedup (0.1: ten times slower than their model)",
    )
    ap.add_argument("--sims", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=2048, help="KV cache blocks per sim (16 tokens each)")
    ap.add_argument("--tokens-per-block", type=int, default=32, help="tokens per 512-token trace block")
    ap.add_argument("--output-div", type=int, default=4, help="divide output lengths by this")
    ap.add_argument("--prefill-rate", type=float, default=20000.0, help="sim prefill tokens/s")
    ap.add_argument(
        "--fast",
        type=float,
        default=1.0,
        help="every other sim prefills this many times faster (heterogeneous)",
    )
    ap.add_argument("--routers", default=f"kv-aware,round-robin,{SGLANG}")
    ap.add_argument("--sglang-python", default=sys.executable, help="an interpreter with sglang-router")
    ap.add_argument(
        "--virtual", action="store_true", help="also replay the same prompts in saturation.py's virtual time"
    )
    a = ap.parse_args()
    raw = load_trace(a.trace, a.rows, a.speedup, a.tokens_per_block, a.output_div, a.skip)
    texts = [prompt_text(x.prompt) for x in raw]
    tok = SimTokenizer()
    arrivals = [Arrival(x.t, tok.encode(t), x.max_tokens) for x, t in zip(raw, texts, strict=True)]
    bound = pooled_bound(arrivals, a.sims * a.blocks)
    span = arrivals[-1].t
    offered = sum(len(x.prompt) for x in arrivals) / max(span, 1e-9) / (a.sims * a.prefill_rate)
    print(
        f"{len(arrivals)} requests (rows {a.skip}-{a.skip + len(arrivals) - 1}) over {span:.1f} s of sim time "
        f"= {span / a.sim_speedup:.0f} s wall; {a.sims} sims × {a.blocks} blocks; uncached prefill load "
        f"{offered:.2f}× the fleet's; pooled-LRU bound hit {bound:.3f}",
        flush=True,
    )
    print(
        f"{'router':<20} {'TTFT p50':>9} {'p90':>7} {'p99':>7} {'hit':>6} {'/bound':>7} {'preempt':>7} "
        f"{'errors':>6} {'late p99 ms':>11} {'fast':>5} {'router CPU ms/req':>17}",
        flush=True,
    )
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="saturation-live-") as tmp:
        for name in a.routers.split(","):
            if name == SGLANG and not has_sglang(a.sglang_python):
                print(f"{name}: sglang-router not importable from {a.sglang_python}: skipped", flush=True)
                continue
            r = rows[name] = run_live(name, arrivals, texts, a, Path(tmp))
            print(
                f"{name:<20} {r['ttft_p50']:9.3f} {r['ttft_p90']:7.3f} {r['ttft_p99']:7.3f} {r['hit']:6.3f} "
                f"{r['hit'] / bound:7.3f} {r['preemptions']:7.0f} {r['errors']:6.0f} {r['late_p99_ms']:11.1f} "
                f"{r['fast_share']:5.2f} "
                f"{r['router_cpu_ms']:17.2f} (loop {r['cpu_loop_ms']:.2f}, threads {r['cpu_threads_ms']:.2f}, "
                f"zmq {r['cpu_zmq_ms']:.2f})",
                flush=True,
            )
    if a.virtual:
        reg = registry()
        for name in a.routers.split(","):
            v = run(name, arrivals, a, reg)
            print(
                f"{name + ' (virtual)':<20} {v['ttft_p50']:9.3f} {v['ttft_p90']:7.3f} {v['ttft_p99']:7.3f} "
                f"{v['hit']:6.3f} {v['hit'] / bound:7.3f} {v['preemptions']:7.0f}",
                flush=True,
            )
    print_ratios(rows, sglang_label="sglang-router")


if __name__ == "__main__":
    main()

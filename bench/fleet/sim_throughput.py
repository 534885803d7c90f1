"""Sim engine throughput: N requests of a shared-prefix workload through one sim process.

Starts ``python -m infera_sim.server --speedup inf`` (KV events on, a subscriber
draining them), sends ``--requests`` completions (``--prefixes`` shared system prompts
of ``--prefix-words`` words + a unique tail) with ``--concurrency`` in flight from
``--clients`` client processes, and reports requests/s, the sim's CPU time per
request, the prefix-cache hit rate and KV event batches seen.

Run: ``.venv/bin/python -m bench.fleet.sim_throughput [--requests 10000] [--stream] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import random
import socket
import threading
import time
from typing import Any

import aiohttp
import psutil
import zmq
from infera_sim.metrics import parse_gauges
from infera_sim.testing import start_sim


def _prompts(n: int, prefixes: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    systems = [" ".join(f"sys{p}w{rng.randrange(500)}" for _ in range(words)) for p in range(prefixes)]
    return [f"{systems[i % prefixes]} user {i} asks about item{rng.randrange(10**6)}" for i in range(n)]


async def _client(url: str, prompts: list[str], concurrency: int, max_tokens: int, stream: bool) -> int:
    sem = asyncio.Semaphore(concurrency)
    ok = 0
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def one(prompt: str) -> None:
            nonlocal ok
            body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
            async with sem, session.post(url + "/v1/completions", json=body) as resp:
                await resp.read()
                ok += resp.status == 200

        await asyncio.gather(*(one(p) for p in prompts))
    return ok


async def _raw_client(url: str, prompts: list[str], concurrency: int, max_tokens: int, stream: bool) -> int:
    """A minimal keep-alive HTTP/1.1 client (so the client is not what the bench measures)."""
    host, port = url.removeprefix("http://").split(":")
    it = iter(prompts)
    ok = 0

    async def worker() -> None:
        nonlocal ok
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for prompt in it:
            body = json.dumps(
                {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
            ).encode()
            head = b"POST /v1/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
            writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            headers = await reader.readuntil(b"\r\n\r\n")
            ok += headers[9:12] == b"200"
            lower = headers.lower()
            if b"transfer-encoding: chunked" in lower:
                while True:
                    size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                    await reader.readexactly(size + 2)
                    if size == 0:
                        break
            else:
                start = lower.index(b"content-length:") + 15
                await reader.readexactly(int(lower[start : lower.index(b"\r\n", start)]))
        writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ok


def _client_proc(
    url: str, prompts: list[str], concurrency: int, max_tokens: int, stream: bool, out: Any
) -> None:
    out.put(asyncio.run(_raw_client(url, prompts, concurrency, max_tokens, stream)))


async def _in_process(prompts: list[str], max_tokens: int, cache_blocks: int) -> tuple[float, int]:
    """The engine core alone (tokenize, schedule, cache, encode events): no HTTP."""
    from infera_sim.config import SimConfig
    from infera_sim.engine import SimEngine
    from infera_sim.kv_publisher import encode_batch
    from infera_sim.request import SimRequest
    from infera_sim.tokenizer import SimTokenizer

    cfg = SimConfig(speedup=float("inf"), cache_blocks=cache_blocks, max_num_seqs=1024)
    tok = SimTokenizer()
    batches = [0]

    def publish(ts: float, events: list[Any]) -> None:
        encode_batch(ts, events, 0, "map")
        batches[0] += 1

    engine = SimEngine(cfg, tok, publish)
    task = asyncio.get_running_loop().create_task(engine.run())
    start = time.perf_counter()
    reqs = []
    for i, prompt in enumerate(prompts):
        r = SimRequest(str(i), tok.encode(prompt), max_tokens)
        r.stream = False
        reqs.append(r)
        engine.add(r)
    for r in reqs:
        while not r.done:
            await r.wake.wait()
            r.wake.clear()
    elapsed = time.perf_counter() - start
    task.cancel()
    return elapsed, batches[0]


def _drain_events(endpoint: str, stop: threading.Event, counts: list[int]) -> None:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    while not stop.is_set():
        if sub.poll(100):
            sub.recv_multipart()
            counts[0] += 1
    sub.close(0)
    ctx.term()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=128, help="in flight per client process")
    ap.add_argument("--clients", type=int, default=1, help="client processes")
    ap.add_argument("--prefixes", type=int, default=8)
    ap.add_argument("--prefix-words", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--client", choices=("raw", "aiohttp"), default="raw", help="HTTP client of the bench")
    ap.add_argument("--cache-blocks", type=int, default=16384)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--in-process", action="store_true", help="the engine core alone, no HTTP")
    args = ap.parse_args()

    prompts = _prompts(args.requests, args.prefixes, args.prefix_words, seed=1)
    if args.in_process:
        elapsed, batches = asyncio.run(_in_process(prompts, args.max_tokens, args.cache_blocks))
        result = {"mode": "in-process engine core", "requests": args.requests, "seconds": round(elapsed, 3)}
        result.update(requests_per_s=round(args.requests / elapsed, 1), kv_event_batches=batches)
        print(json.dumps(result) if args.json else "\n".join(f"{k:>24}: {v}" for k, v in result.items()))
        return
    flags: dict[str, Any] = {"model": "bench", "speedup": "inf", "cache_blocks": args.cache_blocks}
    flags["max_num_seqs"] = 1024
    with start_sim(**flags) as sim:
        assert sim.kv_events_endpoint is not None
        stop = threading.Event()
        counts = [0]
        drain = threading.Thread(
            target=_drain_events, args=(sim.kv_events_endpoint, stop, counts), daemon=True
        )
        drain.start()
        proc = psutil.Process(sim.proc.pid)
        cpu0 = proc.cpu_times()
        start = time.perf_counter()
        if args.clients == 1:
            client = _raw_client if args.client == "raw" else _client
            ok = asyncio.run(client(sim.url, prompts, args.concurrency, args.max_tokens, args.stream))
        else:
            queue: Any = mp.Queue()
            shards = [prompts[i :: args.clients] for i in range(args.clients)]
            procs = [
                mp.Process(
                    target=_client_proc,
                    args=(sim.url, shard, args.concurrency, args.max_tokens, args.stream, queue),
                )
                for shard in shards
            ]
            for p in procs:
                p.start()
            ok = sum(queue.get() for _ in procs)
            for p in procs:
                p.join()
        elapsed = time.perf_counter() - start
        cpu1 = proc.cpu_times()
        time.sleep(0.3)
        stop.set()
        drain.join()
        import httpx

        metrics = parse_gauges(
            httpx.get(sim.url + "/metrics").text,
            (
                "vllm:prefix_cache_hits_total",
                "vllm:prefix_cache_queries_total",
                "vllm:generation_tokens_total",
            ),
        )
    sim_cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    report = {
        "requests": args.requests,
        "ok": ok,
        "stream": args.stream,
        "seconds": round(elapsed, 3),
        "requests_per_s": round(args.requests / elapsed, 1),
        "sim_cpu_ms_per_request": round(1000 * sim_cpu / args.requests, 3),
        "prefix_hit_rate": round(
            metrics.get("vllm:prefix_cache_hits_total", 0)
            / max(1.0, metrics.get("vllm:prefix_cache_queries_total", 1)),
            3,
        ),
        "generation_tokens": int(metrics.get("vllm:generation_tokens_total", 0)),
        "kv_event_batches": counts[0],
    }
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:>24}: {v}")


if __name__ == "__main__":
    main()

"""The bench against a real sim engine process: metrics, JSON and report files."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from bench_cli import bench_cli

from infera_core.bench.runner import BenchConfig, run_bench
from infera_core.bench.trace import trace_workload
from infera_core.bench.workloads import multi_turn_workload
from infera_core.util.prom_text import PROMPT_TOKENS, parse_metrics

pytest.importorskip("infera_sim")


@pytest.fixture
def sim() -> Iterator[str]:
    from infera_sim.testing import start_sim

    with start_sim(speedup=50, max_model_len=8192) as handle:
        yield handle.url


@pytest.mark.slow
def test_cli_shared_prefix_writes_json_and_report(sim: str, tmp_path: Path) -> None:
    workload = (
        "--workload shared-prefix --groups 3 --questions-per-group 4 --prefix-len 160 --question-len 16"
    )
    args = (
        f"--url {sim}/v1 --metrics-url {sim}/metrics {workload} --output-len 8 --concurrency 2 --slo ttft=30s"
    )
    stdout, data = bench_cli(tmp_path, *args.split(), timeout=120)
    assert "prefix-cache hit rate" in stdout
    run = data["runs"][0]
    s = run["summary"]
    assert s["completed"] == s["requests"] == 12
    assert s["output_tokens"] == 12 * 8
    assert s["ttft_s"]["p50"] > 0 and s["e2e_s"]["p99"] >= s["e2e_s"]["p50"]
    assert s["slo_attainment"] == 1.0
    # 3 groups × 4 questions on one sim: every later question of a group reuses its prefix
    assert 0.3 < s["prefix_cache_hit_rate"] < 1.0
    assert s["usage_cached_fraction"] == pytest.approx(s["prefix_cache_hit_rate"], abs=0.05)
    assert len(run["requests"]) == 12
    rep = tmp_path / "rep"
    md = (rep / "report.md").read_text()
    for png in ("latency_cdf.png", "hit_rate.png", "worker_load.png"):
        assert (rep / png).stat().st_size > 5000
        assert f"]({png})" in md


async def test_multi_turn_prompt_grows_with_the_conversation(sim: str) -> None:
    sessions = multi_turn_workload(
        sessions=2, turns=3, first_len=40, turn_len=10, output_len=6, think_time=0.01
    )
    run = await run_bench(sessions, BenchConfig(url=sim, concurrency=1, progress=False))
    assert run.summary["completed"] == 6
    prompts = [r.prompt_tokens or 0 for r in run.results]
    for session in (prompts[:3], prompts[3:]):
        # each turn = previous prompt + the reply (6 tokens) + the new message (10 words) + template
        assert session[1] >= session[0] + 16 and session[2] >= session[1] + 16
    cached = [r.cached_tokens or 0 for r in run.results]
    assert cached[1] > 0 and cached[2] > cached[1]


async def test_trace_replay_shares_blocks_between_rows(sim: str, tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1200, "output_length": 4, "hash_ids": [1, 2, 3]},
        {"timestamp": 200, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 9]},
        {"timestamp": 400, "input_length": 600, "output_length": 4, "hash_ids": [5, 6]},
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sessions = trace_workload(trace, time_scale=0.5)
    run = await run_bench(sessions, BenchConfig(url=f"{sim}/v1", concurrency=None, progress=False))
    assert run.summary["completed"] == 3
    by_len = {r.prompt_tokens: r for r in run.results}
    assert set(by_len) == {1200, 1100, 600}  # token-id prompts are used as given
    assert (by_len[1100].cached_tokens or 0) >= 1024  # hash ids 1 and 2: two 512-token blocks
    assert (by_len[600].cached_tokens or 0) == 0
    assert max(r.start for r in run.results) >= 0.15  # arrivals follow the (scaled) timestamps


async def test_streams_are_read_to_their_end_and_the_connection_reused() -> None:
    """A stream is read past ``[DONE]`` to its last chunk, however late that comes (a router
    sends it once the worker's stream ended): one connection serves every request. Leaving
    at ``[DONE]`` closed the connection each time, and the router logged each request as
    an unfinished response."""
    import asyncio
    import time

    import aiohttp

    from infera_core.bench.client import send

    def chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    event = b'data: {"choices":[{"index":0,"text":"tok"}]}\n\n'
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
                writer.write(b"transfer-encoding: chunked\r\n\r\n" + chunk(event) * 3)
                writer.write(chunk(b"data: [DONE]\n\n"))
                await asyncio.sleep(0.05)  # the stream's end follows [DONE] a little later
                writer.write(b"0\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"
    body = {"model": "m", "prompt": "one two three", "max_tokens": 3, "stream": True}
    async with server, aiohttp.ClientSession() as session:
        results = [await send(session, url, body, time.perf_counter(), 30) for _ in range(4)]
    assert [(r.error, r.output_tokens) for r in results] == [(None, 3)] * 4
    assert all(r.e2e is not None and r.ttft is not None and r.e2e >= r.ttft for r in results)
    assert connections == 1


@pytest.mark.slow
async def test_compare_two_targets_side_by_side(tmp_path: Path) -> None:
    from infera_sim.testing import start_sim
    from rich.console import Console

    from infera_core.bench.config import BenchSettings
    from infera_core.bench.report import write_report
    from infera_core.up.compare import run_targets

    # the second engine prefills far slower (≈0.5 s per prompt): the comparison must show it
    with (
        start_sim(speedup=20) as fast,
        start_sim(speedup=2, prefill_tokens_per_s=200) as slow,
    ):
        settings = BenchSettings(
            url=[f"{fast.url}/v1", f"{slow.url}/v1"],
            compare=True,
            workload="random",
            num_requests=12,
            input_len=200,
            output_len=4,
            concurrency=2,
            metrics_url=[],
            quiet=True,
        )
        runs = await run_targets(settings, Console(quiet=True))
        md = write_report(runs, tmp_path, {"workload": "random"})
    assert [r.label for r in runs] == [fast.url.split("://")[1], slow.url.split("://")[1]]
    assert all(r.summary["completed"] == 12 for r in runs)
    assert runs[1].summary["ttft_s"]["p50"] > 2 * runs[0].summary["ttft_s"]["p50"]
    text = md.read_text()
    assert runs[0].label in text and runs[1].label in text
    assert (tmp_path / "latency_cdf.png").stat().st_size > 5000


@pytest.mark.slow
def test_ctrl_c_stops_sending_and_still_reports(tmp_path: Path) -> None:
    import signal
    import time

    from infera_sim.testing import start_sim

    with start_sim(speedup=1) as engine:
        argv = [sys.executable, "-m", "infera_core", "bench", "--url", f"{engine.url}/v1"]
        argv += ["--num-requests", "5000", "--input-len", "16", "--output-len", "32", "--concurrency", "2"]
        argv += ["--quiet", "--json", str(tmp_path / "r.json")]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # Ctrl-C once requests are flowing
            text = httpx.get(f"{engine.url}/metrics", timeout=5).text
            if parse_metrics(text, [PROMPT_TOKENS]).get(PROMPT_TOKENS, 0) > 200:
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "waiting for requests in flight" in err
    s = json.loads((tmp_path / "r.json").read_text())["runs"][0]["summary"]
    assert 0 < s["completed"] == s["requests"] < 5000  # stopped early, nothing cut mid-request
    assert s["prefix_cache_hit_rate"] is not None  # a bare engine's own /metrics is read
    assert "TTFT p50" in out

"""Real vLLM with no tokenizer flag anywhere: the router learns the model from the workers' cards.

Issue 27's first Done-when row. Two real vLLM CPU workers, (a) under ``infera-run up --engine
vllm --workers 2`` and (b) started by the seed's ``python -m infera.engine.vllm`` with etcd and
``infera-run serve`` in front, each fed 8 conversations × 3 turns over ``/v1/chat/completions``,
``/v1/messages`` and ``/v1/completions``: no request goes untokenized, and vLLM's own
prefix-cache hits (summed over both workers) are at least twice round-robin's on the same
workload, run again on fresh workers. The turns are ordered so that round-robin sends each
conversation's second turn to the other worker. Needs ``.venv-vllm`` (skips visibly without it).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from real_vllm import ENGINE_ARGS, engine_env, long_prompt, prefix_cache, stop_launcher, vllm_python

from infera_core.engines.support import metrics_sum
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import LauncherProcess
from infera_core.util.net import free_port, stop_groups, wait_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1500)]

GROUPS = 8
ROUTES = ("/v1/chat/completions", "/v1/messages", "/v1/completions")


def _turn(g: int, r: int) -> str:
    return long_prompt(f"conversation {g} turn {r}", 90)


def _body(model: str, route: str, g: int, r: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": 2, "temperature": 0}
    if route == "/v1/completions":
        body["prompt"] = " ".join(_turn(g, k) for k in range(r + 1))
        return body
    messages: list[dict[str, str]] = []
    for k in range(r + 1):
        if k:
            messages.append({"role": "assistant", "content": "ok"})
        messages.append({"role": "user", "content": _turn(g, k)})
    body["messages"] = messages
    return body


def _order(r: int) -> list[int]:
    """Round 1 swaps neighbours, so round-robin sends each conversation's second turn to the
    other worker (the third goes back to the first)."""
    groups = list(range(GROUPS))
    return [g ^ 1 for g in groups] if r == 1 else groups


def _views(url: str, workers: list[str]) -> dict[str, int]:
    out = {}
    for w in workers:
        r = httpx.get(f"{url}/v1/admin/cache-view/{w}", timeout=10)
        out[w] = int(r.json().get("blocks", 0)) if r.status_code == 200 else 0
    return out


def run_workload(url: str, model: str, workers: list[str], follow_events: bool) -> None:
    """8 conversations × 3 turns, one at a time; with ``follow_events`` each next request waits
    until the router mirrors the blocks of the previous one (KV events are asynchronous)."""
    with httpx.Client(timeout=120) as client:
        for r in range(3):
            for g in _order(r):
                route = ROUTES[g % len(ROUTES)]
                before = sum(_views(url, workers).values()) if follow_events else 0
                resp = client.post(f"{url}{route}", json=_body(model, route, g, r))
                assert resp.status_code == 200, (route, resp.text)
                deadline = time.monotonic() + 30
                while follow_events and sum(_views(url, workers).values()) <= before:
                    assert time.monotonic() < deadline, f"router never mirrored the blocks of {route} {g}/{r}"
                    time.sleep(0.1)


def why(log: Path) -> list[str]:
    """The router's lines about tokenizing and cards (for a failing assertion)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [ln for ln in text.splitlines() if "tokeniz" in ln or "card" in ln][:8]


def router_counts(url: str, model: str) -> tuple[float, float]:
    """(tokenize failures, tokenized requests) of the router for ``model``."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    fails = metrics_sum(text, ["infera_routing_tokenize_failures_total"]) or 0.0
    done = metrics_sum(text, ["infera_routing_tokenized_total"]) or 0.0
    return fails, done


def workers_of(url: str) -> list[dict[str, Any]]:
    listed = httpx.get(f"{url}/v1/workers", timeout=10).json()
    rows: list[dict[str, Any]] = listed.get("data", listed) if isinstance(listed, dict) else listed
    return rows


def wait_cards(url: str, count: int, within: float = 120) -> list[dict[str, Any]]:
    """The router's workers once ``count`` of them are listed with their card in use."""
    deadline = time.monotonic() + within
    while True:
        rows = workers_of(url)
        if len(rows) >= count and all((r.get("model_card") or {}).get("status") == "in use" for r in rows):
            return rows
        assert time.monotonic() < deadline, f"cards never in use: {rows}"
        time.sleep(0.5)


def hits(rows: list[dict[str, Any]]) -> tuple[float, float]:
    total_h = total_q = 0.0
    for row in rows:
        h, q = prefix_cache(row["url"])
        total_h, total_q = total_h + h, total_q + q
    return total_h, total_q


def _up(tmp: Path, policy: str) -> Iterator[str]:
    python, model = vllm_python()
    port = free_port()
    env = {
        **engine_env(tmp / f"cache-{policy}"),
        "INFERA_ENGINE_PYTHON": python,
        "XDG_CACHE_HOME": str(tmp / f"xdg-{policy}"),  # the router's card cache
    }
    log = (tmp / f"up-{policy}.log").open("wb")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "infera_core", "up", "--engine", "vllm", "--workers", "2"),
            *("--model", "tiny", "--model-path", model, "--port", str(port), "--router-policy", policy),
            *("--ready-timeout", "600"),
            "--",
            *ENGINE_ARGS,
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_port("127.0.0.1", port, 600)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_groups([proc], grace=60)
        log.close()


def _phase_up(tmp: Path, policy: str) -> tuple[float, float, float, float]:
    for url in _up(tmp, policy):
        rows = wait_cards(url, 2, within=600) if policy == "kv-aware" else _wait_listed(url, 2)
        run_workload(url, "tiny", [r["worker_id"] for r in rows], follow_events=policy == "kv-aware")
        fails, done = router_counts(url, "tiny")
        h, q = hits(rows)
        return fails, done, h, q
    raise AssertionError("up did not start")


def _wait_listed(url: str, count: int, within: float = 600) -> list[dict[str, Any]]:
    deadline = time.monotonic() + within
    while len(rows := workers_of(url)) < count:
        assert time.monotonic() < deadline, f"only {rows} listed"
        time.sleep(0.5)
    return rows


def test_up_vllm_routes_by_cache_with_no_tokenizer_flag(tmp_path: Path) -> None:
    fails, done, h_kv, q_kv = _phase_up(tmp_path, "kv-aware")
    assert fails == 0 and done >= GROUPS * 3, (fails, done, why(tmp_path / "up-kv-aware.log"))
    _, _, h_rr, q_rr = _phase_up(tmp_path, "round-robin")
    assert q_kv > 0 and q_rr > 0
    print(f"prefix-cache hits: kv-aware {h_kv:g}/{q_kv:g}, round-robin {h_rr:g}/{q_rr:g}")
    assert h_kv / q_kv >= 2 * (h_rr / q_rr), (h_kv, q_kv, h_rr, q_rr)


def _seed_workers(tmp: Path, etcd: EtcdServer, tag: str) -> list[LauncherProcess]:
    python, model = vllm_python()
    procs = []
    for i in range(2):
        args = [
            *("--model", model, "--port", str(free_port()), "--host", "127.0.0.1"),
            *("--etcd-endpoint", etcd.endpoint, "--worker-id", f"{tag}-{i}", "--engine-python", python),
            *("--enable-kv-events", "--lease-ttl", "3"),
            *ENGINE_ARGS,
        ]
        procs.append(LauncherProcess(args, engine_env(tmp / f"cache-{tag}-{i}"), module="infera.engine.vllm"))
    return procs


def _serve(etcd: EtcdServer, tmp: Path, policy: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = (tmp / f"serve-{policy}.log").open("wb")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "infera_core", "serve", "--port", str(port)),
            *("--discovery", "etcd", "--etcd-endpoint", etcd.endpoint, "--router-policy", policy),
            *("--card-cache-dir", str(tmp / f"cards-serve-{policy}")),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    wait_port("127.0.0.1", port, 60)
    return proc, f"http://127.0.0.1:{port}"


def _phase_seed(tmp: Path, etcd: EtcdServer, policy: str) -> tuple[float, float, float, float]:
    _, model = vllm_python()
    workers = _seed_workers(tmp, etcd, f"seed-{policy}")
    server, url = _serve(etcd, tmp, policy)
    try:
        rows = wait_cards(url, 2, within=600) if policy == "kv-aware" else _wait_listed(url, 2)
        run_workload(url, model, [r["worker_id"] for r in rows], follow_events=policy == "kv-aware")
        fails, done = router_counts(url, model)
        h, q = hits(rows)
        return fails, done, h, q
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        for w in workers:
            stop_launcher(w)


def test_seed_vllm_workers_and_serve_route_by_cache_with_no_tokenizer_flag(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    fails, done, h_kv, q_kv = _phase_seed(tmp_path, etcd_server, "kv-aware")
    assert fails == 0 and done >= GROUPS * 3, (fails, done, why(tmp_path / "serve-kv-aware.log"))
    _, _, h_rr, q_rr = _phase_seed(tmp_path, etcd_server, "round-robin")
    assert q_kv > 0 and q_rr > 0
    print(f"prefix-cache hits: kv-aware {h_kv:g}/{q_kv:g}, round-robin {h_rr:g}/{q_rr:g}")
    assert h_kv / q_kv >= 2 * (h_rr / q_rr), (h_kv, q_kv, h_rr, q_rr)

"""``infera-run serve --processes 2`` as a user runs it: real etcd, sim workers with ZMQ KV
events, real HTTP with a new connection per request (``SO_REUSEPORT`` spreads connections,
not requests)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from infera_core.discovery.base import DiscoverySettings
from infera_core.discovery.etcd import EtcdDiscovery
from infera_core.testing.etcd import EtcdServer, etcd_binary
from infera_core.testing.fleet import stop_process
from infera_core.util.net import free_port

sim_testing = pytest.importorskip("infera_sim.testing")

pytestmark = pytest.mark.skipif(etcd_binary() is None, reason="etcd is not installed")

MODEL = "sim-model"
BS = 16
INFERA_RUN = str(Path(sys.executable).with_name("infera-run"))
CLOSE = {"connection": "close"}


class Stack:
    """etcd, two sims registered in it, and ``serve --processes N`` in front of them."""

    def __init__(self, proc: subprocess.Popen[str], url: str, sims: list[Any], etcd: EtcdServer) -> None:
        self.proc = proc
        self.etcd = etcd
        self.url = url
        self.sims = sims

    async def get(self, client: httpx.AsyncClient, path: str) -> httpx.Response:
        r = await client.get(self.url + path, headers=CLOSE)
        assert r.status_code == 200, r.text
        return r

    async def from_each(self, client: httpx.AsyncClient, path: str, n: int = 2) -> dict[str, httpx.Response]:
        """``path`` as answered by each of the ``n`` processes (new connections until each answered)."""
        seen: dict[str, httpx.Response] = {}
        for _ in range(200):
            r = await self.get(client, path)
            seen.setdefault(r.headers["x-infera-process"], r)
            if len(seen) == n:
                return seen
        raise AssertionError(f"only processes {sorted(seen)} answered {path}")

    async def processes(self, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        body = (await self.get(client, "/v1/admin/processes")).json()
        data: list[dict[str, Any]] = body["data"]
        return data

    async def complete(self, client: httpx.AsyncClient, prompt: str, **extra: Any) -> httpx.Response:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, **extra}
        return await client.post(self.url + "/v1/completions", json=body, headers=CLOSE)


async def _until(check: Callable[[], Any], within: float = 90.0) -> Any:
    async with asyncio.timeout(within):
        while True:
            got = await check()
            if got:
                return got
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def stack(*serve_args: str, processes: int = 2, **sim_flags: Any) -> AsyncIterator[Stack]:
    flags = {"block_size": BS, **sim_flags}
    with ExitStack() as sync:
        etcd = EtcdServer()
        etcd.start()
        sync.callback(etcd.close)
        sims = [sync.enter_context(sim_testing.start_sim(**flags)) for _ in range(2)]
        async with AsyncExitStack() as stack:
            disc = EtcdDiscovery(DiscoverySettings(etcd_endpoints=[etcd.endpoint]))
            await disc.start()
            stack.push_async_callback(disc.close)
            for i, sim in enumerate(sims):
                reg = await disc.register(sim.record(f"sim-{i}"))
                stack.push_async_callback(reg.deregister)
            port = free_port()
            argv = [INFERA_RUN, "serve", "--port", str(port), "--etcd-endpoint", etcd.endpoint]
            argv += ["--processes", str(processes), *serve_args]
            env = dict(os.environ, INFERA_LOG_LEVEL="warning")
            proc = _popen(argv, env)
            st = Stack(proc, f"http://127.0.0.1:{port}", sims, etcd)
            try:
                async with httpx.AsyncClient(timeout=30) as client:

                    async def up() -> bool:
                        if proc.poll() is not None:
                            raise AssertionError(f"serve exited: {proc.stdout.read() if proc.stdout else ''}")
                        try:
                            r = await client.get(st.url + "/v1/admin/processes", headers=CLOSE)
                        except httpx.HTTPError:
                            return False
                        if processes == 1:
                            return r.status_code == 404
                        return r.status_code == 200 and len(r.json()["data"]) == processes

                    await _until(up)
                    await _until(lambda: _healthy(client, st, processes))
                yield st
            finally:
                stop_process(proc, signal.SIGTERM, within=20)


async def _healthy(client: httpx.AsyncClient, st: Stack, processes: int) -> bool:
    """Every process sees both workers."""
    seen = set()
    for _ in range(40):
        r = await client.get(st.url + "/health", headers=CLOSE)
        if r.status_code != 200 or r.json()["active_workers"] != 2:
            return False
        seen.add(r.headers.get("x-infera-process", "?"))
        if processes == 1 or len(seen) == processes:
            return True
    return True  # /health does not say which process answered; 40 answers in a row were healthy


def _sample(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_requests_spread_over_processes_and_every_route_counts_all_of_them() -> None:
    async with stack("--router-policy", "round-robin") as st, httpx.AsyncClient(timeout=30) as client:
        sent = 40
        for i in range(sent):
            assert (await st.complete(client, f"hello {i}")).status_code == 200
        per_process = {p["process"]: p["requests"] for p in await st.processes(client)}
        assert sorted(per_process) == [0, 1]
        assert all(n > 0 for n in per_process.values()), per_process  # both answered
        assert sum(per_process.values()) == sent

        for proc_id, r in (await st.from_each(client, "/metrics")).items():
            text = r.text
            assert _sample(text, "infera_requests_total", status="200") == sent, proc_id
            assert _sample(text, "infera_process_requests_total") == sent
            assert _sample(text, "infera_server_processes_reporting") == 2
            assert re.search(r'infera_process_requests_total\{process="0"\} [1-9]', text)
            assert re.search(r'infera_process_requests_total\{process="1"\} [1-9]', text)

        workers = {k: r.json() for k, r in (await st.from_each(client, "/v1/workers")).items()}
        assert workers["0"] == workers["1"]
        assert sum(w["picks"] for w in workers["0"]["data"]) == sent

        for r in (await st.from_each(client, "/v1/admin/stats")).values():
            stats = r.json()
            assert sum(row["count"] for row in stats["requests"]) == sent
            assert sum(w["picks"] for w in stats["workers"]) == sent
            e2e = stats["histograms"]["e2e"]["series"]
            assert sum(sum(s["counts"]) for s in e2e.values()) == sent


async def test_a_cached_prefix_lands_on_the_same_worker_whichever_process_routes_it() -> None:
    async with stack("--router-policy", "kv-aware") as st, httpx.AsyncClient(timeout=30) as client:
        prefixes = [" ".join(f"p{p}w{i}" for i in range(400)) for p in range(8)]  # ~25 blocks each
        holder: dict[int, str] = {}
        for p, prefix in enumerate(prefixes):
            r = await st.complete(client, prefix + " first")
            assert r.status_code == 200
            holder[p] = r.headers["x-infera-worker"]
        held = {w: list(holder.values()).count(w) for w in set(holder.values())}

        async def indexed_everywhere() -> bool:
            procs = await st.processes(client)
            return all(p["kv_blocks"].get(w, 0) >= 24 * n for p in procs for w, n in held.items())

        await _until(indexed_everywhere)  # each process's own index holds every prefix
        same: dict[int, int] = {0: 0, 1: 0}
        routed: dict[int, int] = {0: 0, 1: 0}
        before = {p["process"]: p["requests"] for p in await st.processes(client)}
        for q in range(4):
            for p, prefix in enumerate(prefixes):
                r = await st.complete(client, f"{prefix} question {q}")
                assert r.status_code == 200
                after = {p["process"]: p["requests"] for p in await st.processes(client)}
                (by,) = [i for i in after if after[i] != before[i]]  # the process that routed it
                before = after
                routed[by] += 1
                same[by] += r.headers["x-infera-worker"] == holder[p]
        fraction = sum(same.values()) / sum(routed.values())
        print(f"cached prefix on the worker that holds it: {fraction:.0%} (per process {same} of {routed})")
        assert all(n > 0 for n in routed.values()), routed  # both processes routed some
        assert fraction >= 0.95, (same, routed)


async def test_sigterm_drains_every_process_without_losing_a_request() -> None:
    # 100 tokens at 50 ms each: every stream is still running when SIGTERM arrives
    async with (
        stack("--router-policy", "round-robin", itl_base_ms=50) as st,
        httpx.AsyncClient(timeout=60) as client,
    ):
        tasks: list[asyncio.Task[str]] = []

        async def one(i: int, started: asyncio.Event) -> str:
            body = {"model": MODEL, "prompt": f"drain {i}", "max_tokens": 100, "stream": True}
            text = ""
            async with client.stream("POST", st.url + "/v1/completions", json=body, headers=CLOSE) as r:
                assert r.status_code == 200
                async for chunk in r.aiter_text():
                    text += chunk
                    started.set()
            return text

        procs: list[dict[str, Any]] = []
        while len(tasks) < 40 and not (procs and all(p["in_flight"] > 0 for p in procs)):
            started = asyncio.Event()
            tasks.append(asyncio.create_task(one(len(tasks), started)))
            await asyncio.wait_for(started.wait(), 30)
            procs = await st.processes(client)
        assert all(p["in_flight"] > 0 for p in procs), procs  # both processes hold streams
        st.proc.send_signal(signal.SIGTERM)
        bodies = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert all(b.rstrip().endswith("data: [DONE]") for b in bodies)
        assert await asyncio.to_thread(st.proc.wait, 30) == 0
        with pytest.raises(httpx.ConnectError):
            await client.get(st.url + "/health")


async def test_a_killed_process_is_restarted_and_serving_goes_on() -> None:
    async with stack("--router-policy", "round-robin") as st, httpx.AsyncClient(timeout=30) as client:
        victim = (await st.processes(client))[1]
        os.kill(victim["pid"], signal.SIGKILL)

        async def replaced() -> bool:
            try:
                procs = await st.processes(client)
            except httpx.HTTPError:  # a connection the killed process had accepted, or queued
                return False
            return len(procs) == 2 and victim["pid"] not in {p["pid"] for p in procs}

        await _until(replaced)
        for i in range(20):
            assert (await st.complete(client, f"after {i}")).status_code == 200
        assert st.proc.poll() is None
        out = await asyncio.to_thread(_stop, st.proc)
        assert f"server process 1 (pid {victim['pid']}) was killed by SIGKILL; restarting it in 0.5 s" in out


async def test_one_process_is_the_server_itself() -> None:
    async with (
        stack("--router-policy", "round-robin", processes=1) as st,
        httpx.AsyncClient(timeout=30) as client,
    ):
        r = await st.complete(client, "hi")
        assert r.status_code == 200
        assert "x-infera-process" not in (await st.get(client, "/metrics")).headers
        children = await asyncio.to_thread(_children, st.proc.pid)
        assert children == []  # no supervisor, no extra process


def _popen(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _children(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    return out


async def test_kv_ingest_runs_off_the_proxying_loop() -> None:
    """A stalled KV ingest (a flood of events) does not hold up proxying: the server still
    answers while the ``kv-ingest`` thread is busy, and the index catches up after."""
    from infera_core.kv.component import KvRouting
    from infera_core.kv.settings import KvSettings
    from infera_core.testing.fixtures import make_hooks
    from infera_core.testing.server import serving, settings_for

    hooks = make_hooks()
    kv = KvRouting(hooks.catalog(), KvSettings())
    with sim_testing.start_sim(block_size=BS) as sim:
        async with serving(settings_for(router_policy="kv-aware"), hooks, kv=kv) as srv:
            srv.store.put(sim.record("sim-0"))
            await srv.wait_workers(1)
            loop = kv.hub._loop
            assert loop is not None and loop is not asyncio.get_running_loop()
            stalled_until = asyncio.Event()
            running = asyncio.get_running_loop()
            loop.call_soon_threadsafe(time.sleep, 5.0)  # the ingest loop is busy for 5 s
            loop.call_soon_threadsafe(running.call_soon_threadsafe, stalled_until.set)
            async with httpx.AsyncClient(timeout=30) as client:
                body = {"model": MODEL, "prompt": " ".join(f"w{i}" for i in range(100)), "max_tokens": 2}
                r = await client.post(srv.url + "/v1/completions", json=body)
                assert r.status_code == 200
                assert not stalled_until.is_set()  # answered while ingest was still stalled
                await asyncio.wait_for(stalled_until.wait(), 30)

                async def indexed() -> bool:
                    view = (await client.get(srv.url + "/v1/admin/cache-view/sim-0")).json()
                    return int(view["blocks"]) > 0

                await _until(indexed)  # the events published meanwhile were applied after


def test_a_start_up_error_is_one_line_and_exit_status_1() -> None:
    """Process 0 starts alone: etcd unreachable is said once, not once per process."""
    argv = [INFERA_RUN, "serve", "--processes", "2", "--port", str(free_port())]
    argv += ["--etcd-endpoint", f"127.0.0.1:{free_port()}", "--connect-timeout", "1"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("infera-run: error:")]
    assert len(errors) == 1 and "cannot reach etcd" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
async def test_a_process_that_keeps_dying_stops_serve_with_one_line() -> None:
    """etcd goes away, then a process is killed: its restarts cannot start (etcd is
    unreachable), and after the 6th death within a minute serve exits 1 saying so."""
    async with (
        stack("--router-policy", "round-robin", "--connect-timeout", "1") as st,
        httpx.AsyncClient(timeout=30) as client,
    ):
        victim = (await st.processes(client))[1]
        st.etcd.close()
        os.kill(victim["pid"], signal.SIGKILL)
        code = await asyncio.to_thread(st.proc.wait, 90)
        out = st.proc.stdout.read() if st.proc.stdout else ""
        assert code == 1, out
        assert "infera-run: error: server process 1" in out and "within 60 s; stopping" in out, out
        assert "restarting it in 8.0 s" in out and "cannot reach etcd" in out, out
        assert "Traceback" not in out


async def test_usage_per_api_key_counts_every_process(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys: [{name: team-a, key: sk-team-a, tokens_per_day: 1000000}]\n")
    async with (
        stack("--router-policy", "round-robin", "--api-key-file", str(keys)) as st,
        httpx.AsyncClient(timeout=30, headers={"authorization": "Bearer sk-team-a"}) as client,
    ):
        sent = 24
        for i in range(sent):
            assert (await st.complete(client, f"usage {i}")).status_code == 200
        assert all(p["requests"] > 0 for p in await st.processes(client))
        for r in (await st.from_each(client, "/v1/admin/usage")).values():
            (key,) = [k for k in r.json()["keys"] if k["key"] == "team-a"]
            used = key["models_used"][MODEL]
            assert used["requests"] == sent

        async def tokens_today_agree() -> bool:
            # on etcd the budget is the cluster's: each process reads the others' part from
            # the store every couple of seconds (docs/how-to/operate.md, budgets across replicas)
            for r in (await st.from_each(client, "/v1/admin/usage")).values():
                (key,) = [k for k in r.json()["keys"] if k["key"] == "team-a"]
                used = key["models_used"][MODEL]
                if not key["tokens_today"] == used["prompt_tokens"] + used["completion_tokens"] > 0:
                    return False
            return True

        await _until(tokens_today_agree, 30)
        for r in (await st.from_each(client, "/v1/admin/stats")).values():
            (key,) = [k for k in r.json()["usage"] if k["key"] == "team-a"]
            assert key["models_used"][MODEL]["requests"] == sent

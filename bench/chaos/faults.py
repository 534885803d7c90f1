"""Chaos scenarios: faulty workers, hostile KV event frames, the registry going away (see ``run.py``)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable

from bench.chaos.stack import (
    MODEL,
    ChaosStack,
    FakeWorker,
    Row,
    codes_text,
    scenario,
    wait_until,
)
from infera_core.worker import WorkerRecord


# -- faulty workers -------------------------------------------------------------------------------
@scenario(fast=False)
async def hung_worker(stack: ChaosStack) -> Row:
    stack.add_worker("sim-hung", "--fault-hang")
    n = stack.n_workers + 1
    await stack.wait_active(n, 120)
    t0 = time.monotonic()
    codes = await stack.burst(24, concurrency=4)
    lat = time.monotonic() - t0

    async def out() -> bool:
        return not any(w["worker_id"] == "sim-hung" and w["status"] == "active" for w in await stack.fleet())

    left = await wait_until(out, 60)
    stack.stop_worker("sim-hung", fast=True)
    sees = (
        f"{codes_text(codes)} in {lat:.0f} s; the hung worker left rotation after {left + lat:.0f} s"
        if left is not None
        else f"{codes_text(codes)}; the hung worker stayed in rotation"
    )
    ok = all(c == 200 for c in codes) and left is not None and left + lat < 60
    return Row("a worker that accepts requests and never answers (sim --fault-hang)", sees, ok=ok)


PD_MODEL = "chaos-pd-model"


@scenario(fast=False)
async def pd_hung_workers(stack: ChaosStack) -> Row:
    """A PD fleet (vllm-nixl, 2 prefill + 2 decode sims) where one prefill and one decode
    worker accept their legs and never answer: both leave rotation, clients get 200s."""
    pd = {"pd-p1": ("prefill", ()), "pd-p2": ("prefill", ("--fault-hang",))}
    pd |= {"pd-d1": ("decode", ()), "pd-d2": ("decode", ("--fault-hang",))}
    for wid, (role, extra) in pd.items():
        launcher = ("--role", role, "--pd-protocol", "vllm-nixl")
        stack.add_worker(wid, *extra, model=PD_MODEL, launcher_args=launcher)
    try:
        if (missing := await stack.wait_workers(list(pd), 120)) is not None:
            return Row(
                "PD: a prefill and a decode worker that never answer",
                f"the PD fleet never registered: {missing}",
                "-",
                False,
            )
        t0 = time.monotonic()
        codes: list[int] = []

        async def hung_out() -> bool:
            fleet = {w["worker_id"]: w for w in await stack.fleet()}
            return all(fleet.get(w, {}).get("breaker") not in (None, "closed") for w in ("pd-p2", "pd-d2"))

        while time.monotonic() - t0 < 60 and not await hung_out():
            codes += await stack.burst(8, concurrency=4, model=PD_MODEL)
        left = time.monotonic() - t0 if await hung_out() else None
        after = await stack.burst(8, concurrency=4, model=PD_MODEL)
    finally:
        for wid in pd:
            stack.stop_worker(wid, fast=True)
    sees = f"{codes_text(codes)} while they hung, then {codes_text(after)}; " + (
        f"both left rotation after {left:.0f} s" if left is not None else "they stayed in rotation"
    )
    ok = left is not None and all(c == 200 for c in codes + after)
    return Row(
        "PD (vllm-nixl, 2 prefill + 2 decode): one prefill and one decode worker accept legs and never answer (sim --fault-hang)",
        sees,
        ok=ok,
    )


@scenario(fast=False)
async def slow_worker(stack: ChaosStack) -> Row:
    """A slow but live worker (every token 2.5 s) under traffic for 30 s stays in rotation."""
    stack.add_worker("sim-slow", "--speedup", "1", "--itl-base-ms", "2500")
    if (missing := await stack.wait_workers(["sim-slow"], 120)) is not None:
        stack.stop_worker("sim-slow", fast=True)
        return Row("a slow but live worker (2.5 s per token)", f"it never registered: {missing}", "-", False)
    t0 = time.monotonic()
    out = 0
    codes: list[int] = []
    while time.monotonic() - t0 < 30:
        codes += await stack.burst(6, concurrency=3, max_tokens=2)
        fleet = {w["worker_id"]: w for w in await stack.fleet()}
        slow = fleet.get("sim-slow", {})
        if slow.get("status") != "active" or slow.get("breaker") not in (None, "closed"):
            out += 1
    stack.stop_worker("sim-slow", fast=True)
    ok = all(c == 200 for c in codes) and out == 0
    where = "stayed in rotation" if out == 0 else f"was out of rotation at {out} checks"
    return Row(
        "a slow but live worker (2.5 s per token) under traffic for 30 s",
        f"{codes_text(codes)}; it {where}",
        ok=ok,
    )


@scenario(fast=False)
async def erroring_worker(stack: ChaosStack) -> Row:
    stack.add_worker("sim-err", "--fault-error-rate", "1", "--fault-error-status", "500")
    await stack.wait_active(stack.n_workers + 1, 120)
    codes = await stack.burst(30, concurrency=4)
    stack.stop_worker("sim-err", fast=True)
    ok = all(c == 200 for c in codes)
    return Row(
        "a worker answering 500 to every request", codes_text(codes), "nothing" if ok else "the 5xx above", ok
    )


async def _with_traffic(stack: ChaosStack, fault: Callable[[], Awaitable[object]], n: int = 40) -> list[int]:
    traffic = asyncio.create_task(stack.burst(n, concurrency=2))
    await asyncio.sleep(0.5)
    await fault()
    return await traffic


@scenario(fast=True)
async def killed_engine(stack: ChaosStack) -> Row:
    pid = await stack.engine_pid("sim-1")

    async def kill() -> None:
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

    t0 = time.monotonic()
    codes = await _with_traffic(stack, kill)

    async def restarted() -> bool:
        new = await stack.engine_pid("sim-1")
        return new is not None and new != pid and await stack.active() == stack.n_workers

    back = await wait_until(restarted, 60)
    ok = all(c == 200 for c in codes) and back is not None
    again = f"served again after {time.monotonic() - t0:.0f} s" if back is not None else "did not come back"
    sees = f"{codes_text(codes)}; the worker {again}"
    return Row("one engine killed with -9 (launcher --restart-engine on-failure)", sees, ok=ok)


@scenario(fast=True)
async def worker_sigterm(stack: ChaosStack) -> Row:
    async def term() -> None:
        stack.stop_worker("sim-2")

    codes = await _with_traffic(stack, term)
    stack.add_worker("sim-2")
    back = await stack.wait_active(stack.n_workers, 120)
    ok = all(c == 200 for c in codes) and back is not None
    return Row("a worker stopped with SIGTERM mid-traffic (drain)", codes_text(codes), ok=ok)


@scenario(fast=True)
async def extra_bytes_after_response(stack: ChaosStack) -> Row:
    async with FakeWorker("chaos-junk", junk=b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\njunk") as fake:
        key = await stack.register_fake(fake, "fake-junk", "chaos-junk")
        try:

            async def listed() -> bool:
                return any(w["worker_id"] == "fake-junk" for w in await stack.fleet())

            await wait_until(listed, 10)
            codes = [(await stack.chat(model="chaos-junk")).status_code for _ in range(6)]
        finally:
            await stack.etcd_delete(key)
    ok = all(c == 200 for c in codes)
    return Row("a worker writes extra bytes after each complete response", codes_text(codes), ok=ok)


@scenario(fast=True)
async def ghost_record(stack: ChaosStack) -> Row:
    async with FakeWorker(MODEL) as fake:
        key = "/infera/workers/ghost-in-key"
        bad = WorkerRecord(worker_id="ghost-in-record", url=fake.url, model=MODEL, engine="fake")
        await stack.etcd_put(key, bad.model_dump_json())  # a record whose worker_id differs from its key
        await asyncio.sleep(1.0)
        seen = {w["worker_id"] for w in await stack.fleet()} & {"ghost-in-key", "ghost-in-record"}
        await stack.etcd_delete(key)

        async def gone() -> bool:
            return not ({w["worker_id"] for w in await stack.fleet()} & {"ghost-in-key", "ghost-in-record"})

        removed = await wait_until(gone, 10)
    ok = removed is not None and "ghost-in-record" not in seen
    sees = f"while present the router listed {sorted(seen) or 'nothing'}; after the delete: {'gone' if removed is not None else 'still listed'}"
    lost = "nothing" if ok else "a ghost worker stays in the routing table (its requests fail over)"
    return Row("an etcd record whose worker_id differs from its key, then the key deleted", sees, lost, ok)


# -- KV events ---------------------------------------------------------------------------------
async def _metric(stack: ChaosStack, name: str, worker: str) -> float:
    text = (await stack.client.get(f"{stack.root}/metrics", headers=stack.admin())).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name) and f'worker="{worker}"' in line
    )


@scenario(fast=True)
async def kv_bad_frames(stack: ChaosStack) -> Row:
    import msgspec

    payload = msgspec.msgpack.encode([time.time(), [], None])
    async with FakeWorker("chaos-kv", kv=True) as fake:
        key = await stack.register_fake(fake, "fake-kv", "chaos-kv")
        try:
            seq = 0

            async def connected() -> bool:
                nonlocal seq
                fake.publish(b"kv-events", seq.to_bytes(8, "big"), payload)
                seq += 1
                return await _metric(stack, "infera_kv_batches", "fake-kv") > 0

            joined = await wait_until(connected, 15, step=0.2)
            rss0 = stack.router_rss_mb()
            fake.publish(b"kv-events", (-5).to_bytes(8, "big", signed=True), payload)
            fake.publish(b"kv-events", (1).to_bytes(11, "big"), payload)
            fake.publish(b"kv-events", seq.to_bytes(8, "big"), b"\x93\xcb" + b"\x00" * 60 * 2**20)
            await asyncio.sleep(1.0)
            seq += 1
            before = await _metric(stack, "infera_kv_batches", "fake-kv")

            async def flowing() -> bool:
                nonlocal seq
                fake.publish(b"kv-events", seq.to_bytes(8, "big"), payload)
                seq += 1
                return await _metric(stack, "infera_kv_batches", "fake-kv") > before

            still = await wait_until(flowing, 15, step=0.2)
            grew = stack.router_rss_mb() - rss0
            codes = await stack.burst(6)
        finally:
            await stack.etcd_delete(key)
    ok = joined is not None and still is not None and grew < 100 and all(c == 200 for c in codes)
    sees = f"router kept serving ({codes_text(codes)}); later batches {'still applied' if still is not None else 'no longer read'}"
    return Row(
        "ZMQ KV frames: negative seq, 11-byte seq, a 60 MB frame",
        sees,
        f"nothing; router RSS {grew:+.0f} MB",
        ok,
    )


# -- the registry -------------------------------------------------------------------------------
@scenario(fast=False)
async def etcd_down(stack: ChaosStack) -> Row:
    """etcd is stopped for longer than the workers' lease TTL, then started again."""
    await asyncio.to_thread(stack.etcd.stop)
    t0 = time.monotonic()
    codes = await stack.burst(20, concurrency=2)
    await asyncio.sleep(max(0.0, 7 - (time.monotonic() - t0)))  # past --lease-ttl 5
    await asyncio.to_thread(stack.etcd.start)

    async def registered() -> bool:
        return len(await stack.etcd_records()) >= stack.n_workers and await stack.active() >= stack.n_workers

    back = await wait_until(registered, 60)
    ok = all(c == 200 for c in codes) and back is not None
    again = (
        f"every worker registered again {back:.0f} s after etcd returned"
        if back is not None
        else "workers missing"
    )
    return Row(
        "etcd down for 7 s (longer than the lease TTL)",
        f"{codes_text(codes)} while it was down; {again}",
        ok=ok,
    )


@scenario(fast=False)
async def launcher_killed(stack: ChaosStack) -> Row:
    """The launcher itself is killed: its engine goes too (parent-death signal); its record
    stays until the lease expires, and the router retries elsewhere meanwhile."""

    async def kill() -> None:
        stack.stop_worker("sim-2", sig=signal.SIGKILL)

    codes = await _with_traffic(stack, kill, n=60)

    async def gone() -> bool:
        return not any(w["worker_id"] == "sim-2" for w in await stack.fleet())

    expired = await wait_until(gone, 30)
    stack.add_worker("sim-2")
    back = await stack.wait_active(stack.n_workers, 120)
    ok = all(c == 200 for c in codes) and expired is not None and back is not None
    left = f"record gone after {expired:.0f} s (its lease)" if expired is not None else "record stayed"
    return Row("a worker's launcher killed with -9 (engine and all)", f"{codes_text(codes)}; {left}", ok=ok)

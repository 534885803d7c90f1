"""One API-key budget across router replicas: two real ``infera-run serve`` processes on one
store (a real etcd, a real ``nats-server -js`` as the NATS plane, or Kubernetes ConfigMaps on
the stand-in API server of ``infera_k8s.testing``), a key with
``requests_per_minute: --rpm``, driven at ``--rate`` requests per second spread over both
for ``--seconds``; ``--kill-at S`` SIGKILLs the second replica S seconds in (the rest goes to
the first). A request is *admitted* when its answer is not 429 (no worker serves the model,
so an admitted one is answered 404 after admission: the budget is what is measured).

It reports what each replica admitted and the bound: one bucket (``rpm``) plus its refill
over the run (``rpm / 60`` per second), + 5 % (``--processes 1`` replicas; budgets kept per
replica would admit about twice that)::

    .venv/bin/python -m bench.router.global_budgets --store etcd --rpm 60 --rate 5 --seconds 180 --kill-at 90
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx
import yaml

from infera_core.util.net import free_port, stop_process

KEY = "sk-global"
BODY = {"model": "no-such-model", "prompt": "hi", "max_tokens": 1}


@dataclass
class Run:
    """What one drive admitted, per replica, and how long it took."""

    admitted: list[int] = field(default_factory=lambda: [0, 0])
    refused: list[int] = field(default_factory=lambda: [0, 0])
    failed: int = 0
    elapsed: float = 0.0
    killed_at: float | None = None

    def bound(self, rpm: int) -> float:
        """One budget's worth: the bucket plus its refill over the run, + 5 %."""
        return (rpm + rpm / 60.0 * self.elapsed) * 1.05

    def row(self, rpm: int) -> dict[str, float | int | None]:
        return {
            "admitted": sum(self.admitted),
            "admitted_per_replica": self.admitted,
            "refused": sum(self.refused),
            "failed": self.failed,
            "seconds": round(self.elapsed, 1),
            "bound": round(self.bound(rpm), 1),
            "killed_at": self.killed_at,
        }


class Store(Protocol):
    def close(self) -> None: ...


def start_store(kind: str) -> tuple[Store, list[str]]:
    """A started etcd, nats-server or stand-in Kubernetes API server and the ``serve`` flags
    that reach it."""
    if kind == "kubernetes":
        from infera_k8s.testing_thread import StandinInThread

        api = StandinInThread()
        api.start()
        return api, ["--discovery", "kubernetes", "--k8s-api-server", api.url, "--k8s-namespace", "infera"]
    if kind == "etcd":
        from infera_core.testing.etcd import EtcdServer

        etcd = EtcdServer()
        etcd.start()
        return etcd, ["--discovery", "etcd", "--etcd-endpoint", etcd.endpoint]
    from infera_core.util.nats_server import NatsServer

    nats = NatsServer()
    nats.start()
    return nats, ["--discovery", "nats", "--nats-url", nats.url]


@contextlib.contextmanager
def replicas(store_flags: list[str], rpm: int, directory: Path, n: int = 2) -> Iterator[list[Replica]]:
    """``n`` ``serve`` replicas on the store, a key file with one key of ``rpm``."""
    keys = directory / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"name": "global", "key": KEY, "requests_per_minute": rpm}]}))
    infera_run = str(Path(sys.executable).with_name("infera-run"))
    out: list[Replica] = []
    try:
        for i in range(n):
            port = free_port()
            log = open(directory / f"serve-{i}.log", "w")  # noqa: SIM115
            argv = [infera_run, "serve", "--port", str(port), "--api-key-file", str(keys), *store_flags]
            env = dict(os.environ, INFERA_LOG_LEVEL="warning")
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
            out.append(Replica(f"http://127.0.0.1:{port}", proc, log))
        for r in out:
            r.wait_up()
        yield out
    finally:
        for r in out:
            stop_process(r.proc)
            r.log.close()


class Replica:
    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: object) -> None:
        self.url = url
        self.proc = proc
        self.log = log
        self.http = httpx.Client(base_url=url, timeout=30, headers={"authorization": f"Bearer {KEY}"})

    def wait_up(self, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve on {self.url} exited with {self.proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if self.http.get("/v1/models").status_code == 200:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"serve on {self.url} did not answer within {within}s")


def drive(reps: list[Replica], rate: float, seconds: float, kill_at: float | None = None) -> Run:
    """``rate`` requests per second for ``seconds``, alternating over the live replicas, one
    thread per replica (an answer never delays the other replica's requests)."""
    run = Run()
    lock = threading.Lock()
    alive = list(range(len(reps)))
    t0 = time.monotonic()
    total = int(rate * seconds)

    def send(i: int) -> None:
        try:
            status = reps[i].http.post("/v1/completions", json=BODY).status_code
        except httpx.HTTPError:
            with lock:
                run.failed += 1
            return
        with lock:
            if status == 429:
                run.refused[i] += 1
            else:
                run.admitted[i] += 1

    threads: list[threading.Thread] = []
    for n in range(total):
        due = t0 + n / rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)  # the load's schedule, not a wait for a condition
        if kill_at is not None and run.killed_at is None and now - t0 >= kill_at:
            reps[-1].proc.send_signal(signal.SIGKILL)
            reps[-1].proc.wait()
            run.killed_at = round(time.monotonic() - t0, 1)
            alive.remove(len(reps) - 1)
        t = threading.Thread(target=send, args=(alive[n % len(alive)],))
        t.start()
        threads.append(t)
        threads = [t for t in threads if t.is_alive()]
    for t in threads:
        t.join()
    run.elapsed = time.monotonic() - t0
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", choices=["etcd", "nats", "kubernetes"], default="etcd")
    ap.add_argument("--rpm", type=int, default=60)
    ap.add_argument("--rate", type=float, default=5.0, help="requests per second over both replicas")
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--kill-at", type=float, default=None, help="SIGKILL the second replica S s in")
    args = ap.parse_args()
    server, flags = start_store(args.store)
    try:
        with tempfile.TemporaryDirectory() as tmp, replicas(flags, args.rpm, Path(tmp)) as reps:
            run = drive(reps, args.rate, args.seconds, args.kill_at)
    finally:
        server.close()
    print(json.dumps({"store": args.store, "rpm": args.rpm, "rate_per_s": args.rate, **run.row(args.rpm)}))


if __name__ == "__main__":
    main()

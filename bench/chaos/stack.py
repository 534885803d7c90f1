"""The stack ``bench/chaos/run.py`` attacks: a real etcd, ``infera-run serve``, sim workers.

Every process is real and runs on this machine: etcd (Debian ``etcd-server``), the
router (``infera-run serve`` with an admin token, an API-key file, direct mode), and
``infera-run worker sim`` launchers (``--restart-engine on-failure``). Their output goes
to log files in a temp directory (``ChaosStack.logs``), so a full pipe never blocks
anyone. A few scenarios need a misbehaving worker no engine gives: :class:`FakeWorker`
is a raw asyncio HTTP server (optionally writing junk after each response) with a
ZMQ PUB socket for KV events, registered by writing its record straight into etcd.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from infera_core.testing.etcd import EtcdServer
from infera_core.util.net import free_port
from infera_core.worker import DEFAULT_PREFIX, KvEventsInfo, WorkerRecord

MODEL = "chaos-model"
KEY = "sk-chaos-main"
LIMITED_KEY = "sk-chaos-limited"
SLOW_KEY = "sk-chaos-rpm"
ADMIN = "chaos-admin-token"
KEYS_YAML = f"""keys:
  - name: main
    key: {KEY}
  - name: limited
    key: {LIMITED_KEY}
    models: [some-other-model]
  - name: rpm
    key: {SLOW_KEY}
    requests_per_minute: 2
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERA_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], within: float, step: float = 0.1
) -> float | None:
    """Seconds until ``predicate()`` held, or None when it did not within ``within``."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    while True:
        if await predicate():
            return loop.time() - t0
        if loop.time() - t0 > within:
            return None
        await asyncio.sleep(step)


class ChaosStack:
    """``async with ChaosStack(workers=2) as stack:`` — everything up; torn down at the end."""

    def __init__(self, workers: int = 2, speedup: float = 20.0) -> None:
        self.n_workers = workers
        self.speedup = speedup
        self.logs = Path(tempfile.mkdtemp(prefix="infera-chaos-"))
        self.etcd = EtcdServer()
        self.port = free_port()
        self.root = f"http://127.0.0.1:{self.port}"
        self.server: subprocess.Popen[bytes] | None = None
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.serve_flags: set[str] = set()
        self.client = httpx.AsyncClient(timeout=60, trust_env=False)

    # -- processes -------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - the child holds it
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "infera_core", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=_env(),
                start_new_session=True,
            )
        finally:
            log.close()

    def log_text(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    async def __aenter__(self) -> ChaosStack:
        await asyncio.to_thread(self.etcd.start)
        (self.logs / "keys.yaml").write_text(KEYS_YAML)
        help_text = (
            await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "infera_core", "serve", "--help"],
                capture_output=True,
                text=True,
                env=_env(),
                check=False,
            )
        ).stdout
        self.serve_flags = {w for w in help_text.split() if w.startswith("--")}
        self.server = self._spawn("serve", self._serve_args(self.port))
        for i in range(self.n_workers):
            self.add_worker(f"sim-{i + 1}")
        if await self.wait_active(self.n_workers, within=120) is None:
            raise RuntimeError(f"the fleet did not come up; logs in {self.logs}")
        return self

    def _serve_args(self, port: int, *extra: str) -> list[str]:
        args = ["serve", "--port", str(port), "--etcd-endpoint", self.etcd.endpoint]
        for flag, value in (
            ("--admin-token", ADMIN),
            ("--api-key-file", str(self.logs / "keys.yaml")),
            ("--router-mode", "direct"),
        ):
            if flag in self.serve_flags:
                args += [flag, value]
        return args + list(extra)

    @contextlib.asynccontextmanager
    async def second_router(self, *flags: str) -> AsyncIterator[str]:
        """Another ``infera-run serve`` over the same fleet with extra ``flags``; its root URL."""
        port = free_port()
        proc = self._spawn(f"serve-{port}", self._serve_args(port, *flags))
        root = f"http://127.0.0.1:{port}"
        try:

            async def ready() -> bool:
                try:
                    r = await self.client.get(f"{root}/health", timeout=2)
                    return int(r.json().get("active_workers", 0)) >= self.n_workers
                except (httpx.HTTPError, ValueError):
                    return False

            if await wait_until(ready, 60) is None:
                raise RuntimeError(f"the second router did not come up; see {self.logs}/serve-{port}.log")
            yield root
        finally:
            proc.terminate()
            await asyncio.to_thread(proc.wait, 15)

    async def __aexit__(self, *exc: object) -> None:
        for wid in list(self.workers):
            self.stop_worker(wid, sig=signal.SIGKILL)
        if self.server is not None:
            self.server.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(self.server.wait, 15)
            if self.server.poll() is None:
                self.server.kill()
        await self.client.aclose()
        await asyncio.to_thread(self.etcd.close)
        if os.environ.get("INFERA_CHAOS_KEEP_LOGS"):
            print(f"chaos: logs kept in {self.logs}", file=sys.stderr)
        else:
            shutil.rmtree(self.logs, ignore_errors=True)

    def add_worker(
        self,
        worker_id: str,
        *engine_args: str,
        restart: bool = True,
        model: str = MODEL,
        launcher_args: tuple[str, ...] = (),
    ) -> None:
        args = ["worker", "sim", "--model", model, "--etcd-endpoint", self.etcd.endpoint]
        args += ["--worker-id", worker_id, "--drain-timeout", "10", "--lease-ttl", "5", *launcher_args]
        # a loaded machine (the soak runs ~20 processes) can keep etcd from answering a new
        # connection within the default 5 s: a launcher that gives up is a lost worker, not a fault
        args += ["--discovery-timeout", "30"]
        if restart:
            args += ["--restart-engine", "on-failure", "--restart-backoff", "0.5"]
        speedup = [] if "--speedup" in engine_args else ["--speedup", str(self.speedup)]
        args += ["--", *speedup, *engine_args]
        self.workers[worker_id] = self._spawn(worker_id, args)

    def stop_worker(
        self, worker_id: str, sig: signal.Signals = signal.SIGTERM, fast: bool = False
    ) -> subprocess.Popen[bytes]:
        """Signal a worker's launcher (``fast``: a second SIGTERM, skipping the drain wait)."""
        proc = self.workers.pop(worker_id)
        with contextlib.suppress(ProcessLookupError):
            if sig == signal.SIGKILL:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
                if fast:
                    time.sleep(0.2)
                    proc.send_signal(sig)
        return proc

    async def engine_pid(self, worker_id: str) -> int | None:
        """The sim engine process under a worker's launcher."""
        proc = self.workers.get(worker_id)
        if proc is None:
            return None
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children():
                if any("infera_sim.server" in part for part in child.cmdline()):
                    return int(child.pid)
        return None

    def router_rss_mb(self) -> float:
        assert self.server is not None
        return float(psutil.Process(self.server.pid).memory_info().rss) / 2**20

    # -- talking to the router -----------------------------------------------------------
    def headers(self, key: str | None = KEY, **extra: str) -> dict[str, str]:
        return ({"Authorization": f"Bearer {key}"} if key else {}) | extra

    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN}"}

    async def chat(
        self, key: str | None = KEY, within: float = 60, root: str | None = None, **body: Any
    ) -> httpx.Response:
        payload = {"model": MODEL, "messages": [{"role": "user", "content": "hello chaos"}], "max_tokens": 4}
        payload.update(body)
        return await self.client.post(
            f"{root or self.root}/v1/chat/completions",
            json=payload,
            headers=self.headers(key),
            timeout=within,
        )

    async def burst(self, n: int, concurrency: int = 4, **body: Any) -> list[int]:
        """``n`` chat requests, ``concurrency`` at a time; their status codes (0: no answer)."""
        sem = asyncio.Semaphore(concurrency)

        async def one() -> int:
            async with sem:
                try:
                    return (await self.chat(**body)).status_code
                except httpx.HTTPError:
                    return 0

        return list(await asyncio.gather(*(one() for _ in range(n))))

    async def fleet(self) -> list[dict[str, Any]]:
        try:
            r = await self.client.get(f"{self.root}/v1/workers", headers=self.admin(), timeout=5)
            data = r.json().get("data", [])
            return data if isinstance(data, list) else []
        except (httpx.HTTPError, ValueError):
            return []

    async def active(self) -> int:
        try:
            r = await self.client.get(f"{self.root}/health", timeout=5)
            return int(r.json().get("active_workers", 0))
        except (httpx.HTTPError, ValueError):
            return -1

    async def wait_active(self, n: int, within: float) -> float | None:
        async def enough() -> bool:
            return await self.active() >= n

        return await wait_until(enough, within)

    async def wait_workers(self, ids: Sequence[str], within: float) -> str | None:
        """Until every worker in ``ids`` is active in the router's table (whatever the rest of
        the fleet does); None then, else which were not and the last line of their logs."""
        wanted = set(ids)

        async def up() -> bool:
            fleet = await self.fleet()
            return wanted <= {str(w.get("worker_id")) for w in fleet if w.get("status") == "active"}

        if await wait_until(up, within) is not None:
            return None
        status = {str(w.get("worker_id")): w.get("status") for w in await self.fleet()}
        missing = []
        for wid in sorted(wanted):
            if status.get(wid) == "active":
                continue
            proc = self.workers.get(wid)
            code = proc.poll() if proc is not None else None
            lines = self.log_text(wid).strip().splitlines()
            missing.append(
                f"{wid} ({status.get(wid) or 'no record'}"
                + (f", launcher exited {code}" if code is not None else "")
                + (f"; log: {lines[-1][-200:]}" if lines else "; no log")
                + ")"
            )
        in_etcd = await self.etcd_workers()
        return (
            f"not active in the router within {within:g} s: "
            + ", ".join(missing)
            + f"; records in etcd: {', '.join(sorted(in_etcd)) or 'none'}"
        )

    async def settled(self, within: float = 15) -> bool:
        """Until no worker has requests in flight (the router's own accounting)."""

        async def idle() -> bool:
            fleet = await self.fleet()
            return bool(fleet) and all(int(w.get("in_flight") or 0) == 0 for w in fleet)

        return await wait_until(idle, within) is not None

    # -- etcd by hand (records no launcher would write) -------------------------------------
    async def etcd_put(self, key: str, value: str) -> None:
        body = {"key": _b64(key), "value": _b64(value)}
        (await self.client.post(f"{self.etcd.url}/v3/kv/put", json=body, timeout=5)).raise_for_status()

    async def etcd_workers(self) -> set[str]:
        """The worker ids with a record in etcd (``/infera/workers/``), whatever routers see."""
        prefix = "/infera/workers/"
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        body = {"key": _b64(prefix), "range_end": _b64(end), "keys_only": True}
        try:
            r = await self.client.post(f"{self.etcd.url}/v3/kv/range", json=body, timeout=5)
            kvs = r.json().get("kvs") or []
        except (httpx.HTTPError, ValueError):
            return set()
        return {base64.b64decode(kv["key"]).decode()[len(prefix) :] for kv in kvs if "key" in kv}

    async def etcd_delete(self, key: str) -> None:
        body = {"key": _b64(key)}
        (
            await self.client.post(f"{self.etcd.url}/v3/kv/deleterange", json=body, timeout=5)
        ).raise_for_status()

    async def etcd_records(self) -> list[str]:
        """Worker ids with a record in etcd (empty while etcd is down)."""
        end = DEFAULT_PREFIX[:-1] + chr(ord(DEFAULT_PREFIX[-1]) + 1)
        body = {"key": _b64(DEFAULT_PREFIX), "range_end": _b64(end), "keys_only": True}
        try:
            r = await self.client.post(f"{self.etcd.url}/v3/kv/range", json=body, timeout=5)
            kvs = r.json().get("kvs", [])
        except (httpx.HTTPError, ValueError):
            return []
        return [base64.b64decode(kv["key"]).decode()[len(DEFAULT_PREFIX) :] for kv in kvs]

    async def register_fake(
        self, fake: FakeWorker, worker_id: str, model: str, url: str | None = None
    ) -> str:
        """Write a record for ``fake`` into etcd (no lease); its key."""
        kv = None
        if fake.kv_port:
            kv = KvEventsInfo(endpoint=f"tcp://127.0.0.1:{fake.kv_port}", format="vllm", block_size=16)
        record = WorkerRecord(
            worker_id=worker_id, url=url or fake.url, model=model, engine="fake", kv_events=kv
        )
        key = DEFAULT_PREFIX + worker_id
        await self.etcd_put(key, record.model_dump_json())
        return key


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


COMPLETION = (
    b'{"id":"cmpl-fake","object":"chat.completion","created":0,"model":"%s","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}'
)


class FakeWorker:
    """A raw HTTP/1.1 worker: ``/health`` 200, any POST a fixed chat completion; with
    ``junk`` it writes extra bytes after every complete response; with ``kv`` it binds a
    ZMQ PUB socket the router subscribes to (:meth:`publish` sends raw frames)."""

    def __init__(self, model: str, junk: bytes = b"", kv: bool = False) -> None:
        self.model = model.encode()
        self.junk = junk
        self.port = free_port()
        self.kv_port = free_port() if kv else 0
        self.requests = 0
        self._server: asyncio.Server | None = None
        self._pub: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeWorker:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        if self.kv_port:
            import zmq

            self._pub = zmq.Context.instance().socket(zmq.PUB)
            self._pub.bind(f"tcp://127.0.0.1:{self.kv_port}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        if self._pub is not None:
            self._pub.close(linger=0)

    def publish(self, *frames: bytes) -> None:
        self._pub.send_multipart(list(frames))

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                if length:
                    await reader.readexactly(length)
                if head.startswith(b"GET"):
                    body = b"{}"
                else:
                    self.requests += 1
                    body = COMPLETION % self.model
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s%s"
                    % (len(body), body, self.junk)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


def since(t0: float) -> str:
    return f"{time.monotonic() - t0:.1f} s"


# -- scenarios: the row each returns, and the registry ---------------------------------
@dataclass(slots=True)
class Row:
    tried: str
    sees: str
    lost: str = "nothing"
    ok: bool = True


Scenario = Callable[[ChaosStack], Awaitable[Row]]
SCENARIOS: dict[str, tuple[Scenario, bool]] = {}


def scenario(*, fast: bool) -> Callable[[Scenario], Scenario]:
    """Register a scenario; ``fast`` ones (a few seconds) run in ``--fast`` and the smoke test."""

    def add(fn: Scenario) -> Scenario:
        SCENARIOS[fn.__name__] = (fn, fast)
        return fn

    return add


def codes_text(codes: list[int]) -> str:
    return ", ".join(f"{n}×{code or 'no answer'}" for code, n in sorted(Counter(codes).items()))


def error_text(r: httpx.Response) -> str:
    try:
        kind = r.json()["error"]["type"]
    except (ValueError, KeyError, TypeError):
        kind = ""
    return f"{r.status_code} {kind}".strip()

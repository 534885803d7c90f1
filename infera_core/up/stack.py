"""The embedded stack: one discovery, one server (uvicorn in this event loop), N launchers.

Engines run as subprocesses in their own process groups (the launcher's
:class:`~infera_core.launcher.process.EngineProcess`); :meth:`Stack.stop` drains them,
then stops the server. An ``atexit`` hook kills any engine group still alive if the
process leaves without a clean stop.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import uvicorn
from pydantic import SecretStr

from infera_core.discovery.base import Discovery, DiscoverySettings
from infera_core.engines.settings import WorkerSettings
from infera_core.errors import ConfigError, EngineError, InferaError
from infera_core.launcher.runtime import WorkerLauncher
from infera_core.plugin.hooks import InferaHooks
from infera_core.plugin.settings import with_backend_fields
from infera_core.scheduling.router_config import default_policy as router_default_policy
from infera_core.server.fds import fit_connections
from infera_core.up.embedded_nats import embedded_layout, start_embedded_nats, wants_embedded_nats
from infera_core.up.settings import UpSettings
from infera_core.util.nats_layout import Layout

if TYPE_CHECKING:
    from pydantic import BaseModel

    from infera_core.server.kv import KvComponent

log = logging.getLogger("infera.up")

_LIVE_GROUPS: set[int] = set()


def _kill_leftovers() -> None:
    for pgid in list(_LIVE_GROUPS):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    _LIVE_GROUPS.clear()


atexit.register(_kill_leftovers)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling (the stack owns SIGINT/SIGTERM)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


def default_policy(hooks: InferaHooks, engine: str | None = None) -> str:
    """The engine adapter's ``default_policy`` when it names an installed preset (engines
    without KV events say ``approximate-prefix``), else ``kv-aware`` when a plugin provides
    it, else ``round-robin`` (the same rule as ``serve``)."""
    catalog = hooks.catalog()
    adapter = catalog.engines.get(engine) if engine and engine in catalog.engines else None
    preferred = getattr(adapter, "default_policy", None)
    if isinstance(preferred, str) and preferred in catalog.policies.preset_names():
        return preferred
    return router_default_policy(catalog.policies)


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"--port {port} (env INFERA_ROUTER_PORT): cannot listen on {host}:{port} ({exc.strerror}); "
            "pick another port or --port 0 for a free one"
        ) from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class Stack:
    """``async with Stack(settings) as stack:`` → ``stack.url`` serves until the block ends."""

    def __init__(
        self,
        settings: UpSettings,
        hooks: InferaHooks | None = None,
        *,
        engine_args: list[str] | None = None,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.hooks = hooks or InferaHooks.load()
        self.engine_args = list(engine_args or [])
        self.policy = settings.policy or default_policy(self.hooks, settings.engine)
        self._echo = echo
        self.discovery: Discovery | None = None
        self.launchers: list[WorkerLauncher] = []
        self._tasks: list[asyncio.Task[int]] = []
        self._spawned: set[int] = set()
        self._server: _Server | None = None
        self._server_task: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None
        self.port = 0
        self.kv: KvComponent | None = None
        self.nats: Any = None
        """The nats-server this stack started (NATS plane without --nats-url), else None."""
        self.nats_layout: Layout | None = None
        """Its users and permissions (each worker connects as its own user)."""

    # -- addresses -------------------------------------------------------------
    @property
    def url(self) -> str:
        """The OpenAI base URL clients use (``…/v1``)."""
        return f"http://{self.settings.host}:{self.port}/v1"

    @property
    def root(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    def engine_pids(self) -> list[int]:
        return [lc.process.pid for lc in self.launchers if lc.process is not None and lc.process.pid]

    # -- lifecycle -------------------------------------------------------------
    async def __aenter__(self) -> Stack:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Discovery → server → workers; returns once every worker is registered and routable."""
        s = self.settings
        if s.engine not in self.hooks.catalog().engines:
            self.hooks.require("engine", s.engine)  # raises with the available names
        try:
            self._sock = _bind(s.host, s.port)
            self.port = int(self._sock.getsockname()[1])  # worker ids (NATS users) include it
            if wants_embedded_nats(s):
                ids = [self._worker_id(i, role) for i, role in enumerate(s.roles())]
                self.nats_layout = embedded_layout(s, ids)
                self.nats = start_embedded_nats(self.nats_layout)
                router = _nats_credentials(self.nats_layout.credentials("router").settings())
                self.settings = s = s.model_copy(update={"nats_url": self.nats.url, **router})
            self.discovery = self._make_discovery()
            await self.discovery.start()
            await self._start_server()
            await self._start_workers()
            await self._wait_routable(s.ready_timeout)
        except BaseException:
            await self.stop(drain=False)
            raise

    def _make_discovery(self) -> Discovery:
        s = self.settings
        name = s.discovery_name()
        if name != "memory":
            return self.hooks.require("discovery_backend", name).create(DiscoverySettings.of(s))
        from infera_core.discovery.memory import MemoryDiscovery, MemoryStore

        return MemoryDiscovery(MemoryStore())

    def _serve_settings(self) -> Any:
        from infera_core.server.settings import ServeSettings

        s = self.settings
        return with_backend_fields(
            ServeSettings,
            self.hooks.catalog(),
            s,
            host=s.host,
            port=self.port,
            discovery=s.discovery_name(),
            request_transport=s.request_transport,
            kv_event_transport=s.kv_event_transport,
            router_policy=self.policy,
            router_config=s.router_config,
            tokenizer=s.tokenizer_specs(),
            kv_block_size=s.block_size_specs(),
            **s.limits_of(),
            **s.auth_of(),
            **s.faults_of(),
            **s.observe_of(),
            **s.tokenize_of(),
        )

    async def _start_server(self) -> None:
        ss = self._serve_settings()
        exposed = ss.open_to_network(ss.host)
        if exposed:
            log.warning(exposed)
        fit_connections(ss)
        self.kv = _make_kv(ss, self.hooks)
        assert self._sock is not None
        self._server, self._server_task = await self._serve(ss, self.kv, self._sock)

    def routing_summary(self) -> str:
        """Models not routed by token ids, e.g. ``tiny by text prefix`` ('' when all are)."""
        app = self._server.config.app if self._server is not None else None
        modes = getattr(getattr(getattr(app, "state", None), "core", None), "routing_modes", None)
        return modes.summary() if modes is not None else ""

    async def _serve(
        self, ss: Any, kv: KvComponent, sock: socket.socket
    ) -> tuple[_Server, asyncio.Task[None]]:
        """Build the app over this stack's discovery and serve it on ``sock`` in this event loop."""
        from infera_core.server.app import create_app
        from infera_core.server.run import uvicorn_config

        app = create_app(ss, self.hooks, discovery=self.discovery, kv=kv, start_discovery=False)
        config = uvicorn_config(app, ss)
        config.timeout_graceful_shutdown = 5
        server = _Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                exc = task.exception()
                raise InferaError(f"the server did not start: {exc or 'exited early'}")
            await asyncio.sleep(0.02)
        return server, task

    @contextlib.asynccontextmanager
    async def side_server(self, policy: str) -> AsyncIterator[str]:
        """A second router over the same workers with another policy; yields its ``/v1`` URL.

        Used to compare policies on one fleet (``up --demo``) without restarting engines.
        """
        ss = self._serve_settings().model_copy(update={"router_policy": policy, "router_config": None})
        kv = _make_kv(ss, self.hooks)
        sock = _bind(self.settings.host, 0)
        port = int(sock.getsockname()[1])
        server, task = await self._serve(ss, kv, sock)
        try:
            await self.wait_routable(len(self.launchers), self.settings.ready_timeout, port=port)
            yield f"http://{self.settings.host}:{port}/v1"
        finally:
            server.should_exit = True
            with contextlib.suppress(BaseException):
                await task

    def _worker_id(self, index: int, role: str) -> str:
        kind = "" if role == "mixed" else f"{role}-"
        return f"{self.settings.engine}-{kind}{index + 1}-{self.port}"

    def _worker_settings(self, index: int, role: str = "mixed") -> WorkerSettings:
        s = self.settings
        worker_id = self._worker_id(index, role)
        creds: dict[str, Any] = {}
        if self.nats_layout is not None:  # the worker's own NATS user
            creds = _nats_credentials(self.nats_layout.worker(worker_id).settings())
        return with_backend_fields(
            WorkerSettings,
            self.hooks.catalog(),
            s,
            model=s.model,
            model_path=s.model_path,
            host="127.0.0.1" if s.host in ("127.0.0.1", "localhost") else s.host,
            discovery=s.discovery_name(),
            request_transport=s.request_transport,
            kv_event_transport=s.kv_event_transport,
            etcd_endpoint=s.etcd_endpoint,
            worker_id=worker_id,
            role=role,
            ready_timeout=s.ready_timeout,
            drain_timeout=s.drain_timeout,
            stop_timeout=5.0,
            health_failures=5,  # a busy machine (benchmarks on few cores) is not a dead engine
            restart_engine=s.restart_engine,
            max_restarts=s.max_restarts,
            engine_python=s.engine_python,
            labels=s.labels,
            **creds,
        )

    def _shared_discovery(self) -> Discovery | None:
        """The stack's discovery for its launchers, unless each must connect as its own NATS
        user (only a worker may write its record on the embedded, authenticated server)."""
        if self.nats_layout is not None and self.settings.discovery_name() == "nats":
            return None
        return self.discovery

    async def _start_workers(self) -> None:
        s = self.settings
        echo = self._echo if self._echo is not None else (_stderr_echo if s.engine_logs else _no_echo)
        for i, role in enumerate(s.roles()):
            pd = role != "mixed" and s.pd_protocol is not None
            lc = WorkerLauncher(
                self.hooks,
                s.engine,
                self._worker_settings(i, role),
                engine_args=self.engine_args,
                options={"pd_protocol": s.pd_protocol} if pd else None,
                discovery=self._shared_discovery(),
                echo=echo,
                on_spawn=self._track_pid,
            )
            self.launchers.append(lc)
            self._tasks.append(asyncio.create_task(lc.run(), name=f"worker-{i + 1}"))
        registered = asyncio.ensure_future(
            asyncio.gather(*(lc.wait_registered(s.ready_timeout) for lc in self.launchers))
        )
        try:
            while not registered.done():
                for lc, t in zip(self.launchers, self._tasks, strict=True):
                    if t.done():
                        self._raise_failed(lc, t)
                self._track_groups()
                waiting: list[asyncio.Future[Any]] = [registered, *self._tasks]
                await asyncio.wait(waiting, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            self._track_groups()
            for lc, t in zip(self.launchers, self._tasks, strict=True):
                if t.done():
                    self._raise_failed(lc, t)
            if registered.exception() is not None:
                raise EngineError(f"workers not ready: {registered.exception()}")
        finally:
            if not registered.done():
                registered.cancel()
            with contextlib.suppress(BaseException):
                await registered

    def _raise_failed(self, lc: WorkerLauncher, task: asyncio.Task[int]) -> None:
        exc = task.exception() if not task.cancelled() else None
        wid = lc.context.worker_id if lc.context else "?"
        if isinstance(exc, InferaError):
            raise exc
        if exc is not None:
            raise EngineError(f"worker {wid} failed: {type(exc).__name__}: {exc}")
        raise EngineError(f"worker {wid} stopped before it was ready")

    def _track_groups(self) -> None:
        for pid in self.engine_pids():
            self._track_pid(pid)

    def _track_pid(self, pid: int) -> None:
        self._spawned.add(pid)
        _LIVE_GROUPS.add(pid)

    async def _wait_routable(self, within: float) -> None:
        """Until the server's fleet view holds every worker (memory: at once; etcd: a watch away);
        the error of a worker that stops meanwhile (its engine died right after registering)."""
        routable = asyncio.ensure_future(self.wait_routable(len(self.launchers), within))
        try:
            while not routable.done():
                await asyncio.wait([routable, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
                for lc, t in zip(self.launchers, self._tasks, strict=True):
                    if t.done():
                        self._raise_failed(lc, t)
            routable.result()
        finally:
            routable.cancel()

    async def wait_routable(self, count: int, within: float, port: int | None = None) -> None:
        """Until the server (or the side server on ``port``) routes to ``count`` active workers."""
        import httpx

        root = f"http://{self.settings.host}:{port}" if port else self.root
        if count <= 0:
            return

        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
            while True:
                try:
                    r = await client.get(f"{root}/health")
                    if r.status_code == 200 and r.json().get("active_workers", 0) >= count:
                        return
                except (httpx.HTTPError, ValueError):
                    pass
                if loop.time() > deadline:
                    raise EngineError(
                        f"the server did not see {len(self.launchers)} workers within {within:g}s"
                    )
                await asyncio.sleep(0.05)

    async def until_all_workers_stopped(self, report: Callable[[str], None]) -> BaseException:
        """Keep serving while workers die: ``report`` a line for each one that stops for good
        (its engine died and was not, or no longer, restarted); the last one's error once none
        is left."""
        pending = set(self._tasks)
        if not pending:
            await asyncio.Event().wait()
        last: BaseException = EngineError("no workers")
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for lc, t in zip(self.launchers, self._tasks, strict=True):
                if t in done:
                    last = _why_stopped(lc, t)
                    left = len(pending)
                    what = f"serving on {left} of {len(self._tasks)} workers" if left else "no worker left"
                    report(f"worker {_wid(lc)} is down: {_first_line(last)}; {what}")
        return last

    def worker_states(self) -> dict[str, int]:
        """How many launchers are in each state (``serving``, ``restarting``, ``failed``…)."""
        counts: dict[str, int] = {}
        for lc in self.launchers:
            counts[str(lc.state)] = counts.get(str(lc.state), 0) + 1
        return counts

    def skip_drain(self) -> None:
        """Stop without waiting for in-flight requests (a second Ctrl-C)."""
        for lc in self.launchers:
            lc.request_drain()
            lc.request_drain()

    async def stop(self, drain: bool = True) -> None:
        """Drain and stop every worker, then the server and discovery. Idempotent."""
        if self.kv is not None and self._server is not None:
            # the router stops following KV events first: the engines' publishers going away
            # now is an orderly stop, not a lost publisher (no 'events count as lost' warning)
            with contextlib.suppress(Exception):
                await self.kv.stop_following()
        for lc in self.launchers:
            lc.request_drain()
            if not drain:
                lc.request_drain()  # second request: skip the in-flight wait
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for pid in self._spawned | set(self.engine_pids()):
            _LIVE_GROUPS.discard(pid)
        if self._server is not None and self._server_task is not None:
            self._server.should_exit = True
            with contextlib.suppress(BaseException):
                await self._server_task
        elif self._sock is not None:
            self._sock.close()
        self._server = None
        self._server_task = None
        if self.discovery is not None:
            with contextlib.suppress(Exception):
                await self.discovery.close()
            self.discovery = None
        self._tasks = []
        if self.nats is not None:
            self.nats.close()
            self.nats = None


def _wid(lc: WorkerLauncher) -> str:
    return lc.context.worker_id if lc.context else "?"


def _why_stopped(lc: WorkerLauncher, task: asyncio.Task[int]) -> BaseException:
    exc = task.exception() if not task.cancelled() else None
    return exc or EngineError(f"worker {_wid(lc)} stopped on its own")


def _first_line(exc: BaseException) -> str:
    """The error's first line, without the engine-output tail an :class:`EngineError` announces."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text.removesuffix("; last output:")


def _stderr_echo(line: str) -> None:
    import sys

    sys.stderr.write(line + "\n")


def _no_echo(line: str) -> None:
    del line


def _make_kv(settings: BaseModel, hooks: InferaHooks) -> KvComponent:
    """KV-aware routing (event hub, index, routing tokenizers), built the way ``serve`` builds it."""
    from infera_core.kv.component import make_kv_routing

    return make_kv_routing(settings, hooks.catalog())


def _nats_credentials(values: dict[str, str]) -> dict[str, Any]:
    """A user's NATS settings fields, the password as the secret it is in the settings."""
    return {**values, "nats_password": SecretStr(values["nats_password"])}

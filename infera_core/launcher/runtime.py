"""The worker lifecycle: spawn → ready → register → monitor → drain → deregister → stop.

While it monitors, the launcher polls the adapter's readiness check and (every
``--health-generate-interval``) sends a one-token generation (:mod:`.health`): a worker
failing those is published as ``draining`` until it answers again. When the engine dies
after it has served, ``--restart-engine on-failure`` deregisters it, waits a backoff and
starts it again on the same port (:mod:`.restart`); ``never`` ends :meth:`run` with the
engine's error.

Library use (``infera-run up`` runs several launchers in one event loop)::

    launcher = WorkerLauncher(hooks, "sim", WorkerSettings(model="m", discovery="memory"))
    task = asyncio.create_task(launcher.run())
    record = await launcher.wait_registered(within=60)
    ...
    launcher.request_drain()        # or: await launcher.stop()
    exit_code = await task          # 0 after a drain; EngineError when the engine died

:func:`run_worker` runs one launcher with SIGTERM/SIGINT wired to :meth:`request_drain`
(a second signal skips the drain wait).

``discovery=`` hands the launcher an already started :class:`Discovery` (the caller closes
it); without it the launcher creates, starts and closes the backend its settings name.
``echo=`` receives each prefixed engine output line (default: stderr); ``on_spawn=``
the process id of each engine started (the first and every restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from infera_core.discovery.base import Discovery, Registration
from infera_core.engines.base import EngineAdapter, LaunchContext, LaunchSpec, RunningEngine
from infera_core.engines.settings import WorkerSettings
from infera_core.errors import ConfigError, EngineError
from infera_core.launcher.address import advertise_host
from infera_core.launcher.card import CardPublisher
from infera_core.launcher.drain import wait_drained
from infera_core.launcher.flags import launch_options
from infera_core.launcher.health import GenerationWatch, checks_generation, health_generate, serves_inference
from infera_core.launcher.kv_poll import PolledKvPublisher, polled_kv_events
from infera_core.launcher.learned import learned_record
from infera_core.launcher.lora import LoraRefresh
from infera_core.launcher.process import EngineProcess
from infera_core.launcher.record import launch_record
from infera_core.launcher.restart import RestartBudget, WorkerState
from infera_core.launcher.transports import WorkerTransports, worker_context
from infera_core.launcher.waits import first_of, quietly
from infera_core.plugin.hooks import InferaHooks
from infera_core.util.net import free_port
from infera_core.util.redact import redact_url
from infera_core.worker import Status, WorkerRecord

log = logging.getLogger("infera.launcher")

READY_POLL = 0.2


class WorkerLauncher:
    """Runs one engine as a fleet worker (see the module docstring)."""

    def __init__(
        self,
        hooks: InferaHooks,
        engine: str,
        settings: WorkerSettings,
        *,
        engine_args: list[str] | None = None,
        options: dict[str, Any] | None = None,
        discovery: Discovery | None = None,
        echo: Callable[[str], None] | None = None,
        on_spawn: Callable[[int], None] | None = None,
    ) -> None:
        self.hooks = hooks
        self.engine = engine
        self.settings = settings
        self.engine_args = list(engine_args or [])
        self.options = dict(options or {})
        self._discovery = discovery
        self._owns_discovery = discovery is None
        self._discovery_started = discovery is not None
        self._transports: WorkerTransports | None = None
        self._kv_poll: PolledKvPublisher | None = None
        self._echo = echo
        self._on_spawn = on_spawn
        self._budget = RestartBudget(settings)
        self._package_hint = ""
        self.card = CardPublisher()
        self.lora_refresh = LoraRefresh()
        self.state = WorkerState.STARTING
        self.restarts = 0  # engine restarts so far (--restart-engine on-failure)
        self.process: EngineProcess | None = None
        self.context: LaunchContext | None = None
        self.record: WorkerRecord | None = None
        self.registration: Registration | None = None
        self._drain = asyncio.Event()
        self._skip_wait = asyncio.Event()
        self._registered = asyncio.Event()
        self._finished = asyncio.Event()
        self._signals = 0
        self._running = False
        self.error: Exception | None = None  # why run() failed, once it has

    # -- control --------------------------------------------------------------
    def request_drain(self) -> None:
        """First call: drain and stop. Second call: stop without waiting for in-flight work."""
        self._signals += 1
        if self._signals == 1:
            log.info("worker %s: draining", self._wid)
            self._drain.set()
        else:
            log.info("worker %s: second stop request, skipping the drain wait", self._wid)
            self._skip_wait.set()

    async def stop(self) -> None:
        """Drain, then wait until the launcher has finished."""
        if not self._drain.is_set():
            self.request_drain()
        if self._running:
            await self._finished.wait()

    async def wait_registered(self, within: float) -> WorkerRecord:
        """The published record once the engine serves (``TimeoutError`` otherwise)."""
        waiter = asyncio.ensure_future(self._registered.wait())
        finished = asyncio.ensure_future(self._finished.wait())
        try:
            await asyncio.wait({waiter, finished}, timeout=within, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            finished.cancel()
        if not self._registered.is_set() and self.error is not None:
            raise self.error
        if self.record is None or not self._registered.is_set():
            raise TimeoutError(f"worker {self._wid} was not registered within {within:g}s")
        return self.record

    @property
    def _wid(self) -> str:
        return self.context.worker_id if self.context else self.settings.worker_id or self.engine

    # -- the lifecycle ----------------------------------------------------------
    async def run(self) -> int:
        """Run until drained (returns 0) or the engine fails for good (raises :class:`EngineError`)."""
        self._running = True
        try:
            adapter: EngineAdapter = self.hooks.require("engine", self.engine)
            ctx = self._context(adapter)
            self._package_hint = adapter.package_hint
            if self._discovery is None:  # an unknown backend fails before the engine starts
                factory = self.hooks.require("discovery_backend", ctx.discovery or "")
                self._discovery = factory.create(self.settings.discovery_settings())
                self._discovery_started = False
            self._transports = WorkerTransports(
                self.hooks, self.settings.request_transport, self.settings.kv_event_transport
            )
            spec = adapter.build_launch(ctx)
            self.hooks.mutate_engine_launch(ctx, spec)
            async with httpx.AsyncClient(timeout=httpx.Timeout(5.0), trust_env=False) as client:
                while (down := await self._serve_once(adapter, spec, client, ctx)) is not None:
                    if not await self._restart_after(down, ctx):
                        break  # a stop request arrived while the engine was down
                if self.registration is not None and self.process is not None:
                    self.state = WorkerState.DRAINING
                    await self._drain_requests(adapter, client, ctx)
            await self._deregister()
            code = await self.process.stop(self.settings.stop_timeout) if self.process else None
            log.info("worker %s: engine stopped (exit code %s); bye", ctx.worker_id, code)
            self.state = WorkerState.STOPPED
            return 0
        except Exception as exc:
            self.error = exc
            self.state = WorkerState.FAILED
            raise
        finally:
            await self._cleanup()
            self._finished.set()

    async def _serve_once(
        self, adapter: EngineAdapter, spec: LaunchSpec, client: httpx.AsyncClient, ctx: LaunchContext
    ) -> EngineError | None:
        """Spawn the engine, register it once it serves, watch it: None after a stop request,
        the engine's error when it died (raised instead when it never served at all)."""
        prefix = f"[{self.engine}:{ctx.worker_id}]"
        kwargs: dict[str, Any] = {"echo": self._echo} if self._echo else {}
        self.process = EngineProcess(
            spec, prefix, engine=self.engine, package_hint=self._package_hint, **kwargs
        )
        # spawn first (the engine loads while we connect; no fork after gRPC threads start),
        # then fail within the connect timeout when discovery is unreachable
        await self.process.start()
        if self._on_spawn is not None and self.process.pid is not None:
            self._on_spawn(self.process.pid)
        discovery = await self._start_discovery()
        try:
            if not await self._wait_ready(adapter, client, ctx):
                return None  # stopped before the engine was ready
        except EngineError as exc:
            if not self._registered.is_set():
                raise  # it never served: a restart would fail the same way
            return exc
        self.record = await learned_record(
            adapter,
            RunningEngine(ctx, client),
            launch_record(adapter, ctx, spec, self.engine, self.settings.label_map()),
        )
        await self._stop_kv_poll()
        self._kv_poll = polled_kv_events(adapter, RunningEngine(ctx, client), self.record.kv_events, ctx.host)
        assert self._transports is not None
        via = await self._transports.attach(worker_context(ctx, self.record, self.settings))
        self.record = await self.card.prepare(
            self.engine, ctx, self.record.model_copy(update=via), client, discovery
        )
        self.registration = await discovery.register(self.record)
        await self.card.publish(ctx.worker_id)
        self._registered.set()
        self.state = WorkerState.SERVING
        log.info(
            "worker %s registered: %s serving %s at %s",
            ctx.worker_id,
            self.engine,
            ctx.model,
            redact_url(ctx.url),
        )
        loop = asyncio.get_running_loop()
        started = loop.time()
        down = await self._monitor(adapter, client, ctx)
        self._budget.served(loop.time() - started)
        return down

    async def _stop_kv_poll(self) -> None:
        poll, self._kv_poll = self._kv_poll, None
        if poll is not None:
            await poll.close()

    async def _restart_after(self, down: EngineError, ctx: LaunchContext) -> bool:
        """Deregister and stop the dead engine; wait the backoff. False when a stop request came
        first; raises ``down`` when the restart policy says no."""
        assert self.process is not None
        await self._deregister()
        await self._stop_kv_poll()
        await self.process.stop(self.settings.stop_timeout)
        delay = self._budget.next_delay()
        if delay is None:
            if self._budget.total:
                log.error(
                    "worker %s: giving up after %d restarts in a row", ctx.worker_id, self._budget.in_a_row
                )
            raise down
        self.state = WorkerState.RESTARTING
        self.restarts = self._budget.total
        log.warning(
            "worker %s: %s\nrestarting in %gs (restart %d in a row, at most %d)",
            ctx.worker_id,
            down,
            delay,
            self._budget.in_a_row,
            self._budget.max_restarts,
        )
        await first_of(self._drain.wait(), within=delay)
        return not self._drain.is_set()

    def _context(self, adapter: EngineAdapter) -> LaunchContext:
        s = self.settings
        if not s.model:
            raise ConfigError("--model (env INFERA_MODEL) is required: the model name clients send")
        name = s.discovery_name() if self._discovery is None else s.discovery
        if name == "static" and self._discovery is None:
            raise ConfigError(
                "--discovery static is read-only: a worker cannot register there; "
                "use --etcd-endpoint or --discovery memory"
            )
        options, engine_args = launch_options(adapter, self.options, self.engine_args)
        port = s.port or free_port(s.host)
        adv = advertise_host(s.host, s.advertise_host)
        self.context = LaunchContext(
            worker_id=s.worker_id or f"{self.engine}-{adv}-{port}",
            model=s.model,
            model_path=s.model_path,
            role=s.role,
            host=s.host,
            port=port,
            advertise_host=adv,
            engine_args=engine_args,
            options=options,
            engine_python=s.engine_python,
            free_port=lambda: free_port(s.host),
            discovery=name,
            hooks=self.hooks,
        )
        return self.context

    async def _start_discovery(self) -> Discovery:
        assert self._discovery is not None
        if not self._discovery_started:
            await self._discovery.start()
            self._discovery_started = True
        return self._discovery

    def _engine_died(
        self, code: int | None, ctx: LaunchContext, why: str = "", at_start: bool = False
    ) -> EngineError:
        """``at_start``: it exited before it served: its root-cause line says why."""
        assert self.process is not None
        what = why or f"exited with code {code}"
        cause = self.process.root_cause if at_start else None
        if cause is not None:  # the first exception line, not a traceback's last 20 lines
            return EngineError(f"engine {self.engine} (worker {ctx.worker_id}) {what}: {cause}")
        return EngineError(
            f"engine {self.engine} (worker {ctx.worker_id}) {what}; last output:\n{self.process.last_lines()}"
        )

    async def _wait_ready(
        self, adapter: EngineAdapter, client: httpx.AsyncClient, ctx: LaunchContext
    ) -> bool:
        assert self.process is not None and self.process.proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.ready_timeout
        exited = asyncio.ensure_future(self.process.wait())
        warned: list[str] = []
        try:
            while True:
                if self._drain.is_set():
                    return False
                if exited.done():
                    raise self._engine_died(
                        exited.result(),
                        ctx,
                        why=f"exited with code {exited.result()} before it was ready",
                        at_start=True,
                    )
                engine = RunningEngine(ctx, client)
                if await quietly(adapter.is_ready(engine), default=False) and await serves_inference(
                    engine, warned
                ):
                    return True
                if loop.time() > deadline:
                    raise self._engine_died(
                        None, ctx, why=f"was not ready after --ready-timeout {self.settings.ready_timeout:g}s"
                    )
                await first_of(exited, self._drain.wait(), within=READY_POLL)
        finally:
            exited.cancel()

    async def _monitor(
        self, adapter: EngineAdapter, client: httpx.AsyncClient, ctx: LaunchContext
    ) -> EngineError | None:
        """None when a drain is requested; the error when the engine dies or stops answering."""
        assert self.process is not None
        exited = asyncio.ensure_future(self.process.wait())
        watch = self._start_generation_watch(adapter, client, ctx)
        failures = 0
        try:
            while not self._drain.is_set():
                await first_of(exited, self._drain.wait(), within=self.settings.health_interval)
                if exited.done():
                    return self._engine_died(exited.result(), ctx)
                if self._drain.is_set():
                    return None
                if await quietly(adapter.is_ready(RunningEngine(ctx, client)), default=False):
                    failures = 0
                    await self._refresh_lora(client, ctx)
                    continue
                failures += 1
                log.warning(
                    "worker %s: health check failed (%d/%d)",
                    ctx.worker_id,
                    failures,
                    self.settings.health_failures,
                )
                if failures >= self.settings.health_failures:
                    return self._engine_died(
                        None,
                        ctx,
                        why=f"failed {failures} health checks in a row (still running, pid {self.process.pid})",
                    )
            return None
        finally:
            exited.cancel()
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch

    async def _refresh_lora(self, client: httpx.AsyncClient, ctx: LaunchContext) -> None:
        """Republish the record when the engine's LoRA adapters changed (:mod:`.lora`)."""
        record = await self.lora_refresh.changed(client, ctx.url, self.record)
        if record is not None and self.registration is not None:
            self.record = record
            await quietly(self.registration.update(record), default=None)

    def _start_generation_watch(
        self, adapter: EngineAdapter, client: httpx.AsyncClient, ctx: LaunchContext
    ) -> asyncio.Task[None] | None:
        s = self.settings
        if s.health_generate_interval <= 0:
            return None
        if not checks_generation(adapter, ctx.role):
            log.info(
                "worker %s: no generation check for a %s worker of %s", ctx.worker_id, ctx.role, self.engine
            )
            return None

        def check() -> Awaitable[bool]:
            return health_generate(adapter, RunningEngine(ctx, client), s.health_generate_timeout)

        watch = GenerationWatch(
            check,
            self._set_in_rotation,
            worker_id=ctx.worker_id,
            interval=s.health_generate_interval,
            failures=s.health_generate_failures,
        )
        return asyncio.create_task(watch.run(), name=f"generation-check-{ctx.worker_id}")

    async def _set_in_rotation(self, healthy: bool) -> None:
        """Publish ``active`` (healthy) or ``draining`` (hung) for the generation check."""
        if self.registration is None or self.record is None or self._drain.is_set():
            return
        self.state = WorkerState.SERVING if healthy else WorkerState.UNHEALTHY
        self.record = self.record.model_copy(update={"status": Status.ACTIVE if healthy else Status.DRAINING})
        try:
            await self.registration.update(self.record)
        except Exception as exc:
            log.warning("worker %s: could not publish status %s: %s", self._wid, self.record.status, exc)

    async def _drain_requests(
        self, adapter: EngineAdapter, client: httpx.AsyncClient, ctx: LaunchContext
    ) -> None:
        assert self.registration is not None and self.record is not None and self.process is not None
        self.record = self.record.model_copy(update={"status": Status.DRAINING})
        try:
            await self.registration.update(self.record)
        except Exception as exc:  # still drain: the router sees the deletion instead
            log.warning("worker %s: could not publish draining status: %s", ctx.worker_id, exc)
        await wait_drained(
            adapter,
            RunningEngine(ctx, client),
            self.settings.drain_timeout,
            self._skip_wait,
            lambda: self.process is not None and self.process.returncode is None,
        )

    async def _deregister(self) -> None:
        if self.registration is not None:
            registration, self.registration = self.registration, None
            try:
                await registration.deregister()
                log.info("worker %s deregistered", self._wid)
                await self.card.release()
            except Exception as exc:
                log.warning(
                    "worker %s: deregistration failed (%s); the lease expires on its own", self._wid, exc
                )

    async def _cleanup(self) -> None:
        with contextlib.suppress(Exception):
            await self._deregister()
        with contextlib.suppress(Exception):
            await self._stop_kv_poll()
        if self._transports is not None:
            try:
                await self._transports.close()
            except Exception:
                log.exception("worker %s: a transport's worker side failed to stop", self._wid)
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(Exception):
                await self.process.stop(self.settings.stop_timeout)
        if self._owns_discovery and self._discovery is not None:
            with contextlib.suppress(Exception):
                await self._discovery.close()


async def run_worker(
    hooks: InferaHooks,
    engine: str,
    settings: WorkerSettings,
    *,
    engine_args: list[str] | None = None,
    options: dict[str, Any] | None = None,
) -> int:
    """Run one launcher with SIGTERM/SIGINT → drain (a second signal skips the wait)."""
    launcher = WorkerLauncher(hooks, engine, settings, engine_args=engine_args, options=options)
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, launcher.request_drain)
            installed.append(sig)
    try:
        return await launcher.run()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)

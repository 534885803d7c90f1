"""``infera-run serve --processes N``: N server processes on one port, under one supervisor.

The supervisor (the process the user started) reserves the port (bound with
``SO_REUSEPORT``, never listening: port 0 resolves once and a port in use fails at once),
then forks the server processes. Each binds its own listening socket on that port with
``SO_REUSEPORT`` (the kernel spreads connections over them), builds its own app with its
own discovery watch (the fleet view) and its own KV hub (it subscribes to every worker's
KV events itself: the same events in the same order give every process the same index,
with no shared structure to lock on the routing path), and answers for the whole router
on the aggregated routes (:mod:`infera_core.server.peers`).

* Start: process 0 first; the others once it serves, so a start-up error (etcd
  unreachable, a bad flag value) is printed once, by process 0, and serve exits 1.
* A process that dies after it started serving is restarted (same index, same socket
  path) after 0.5 s, doubling up to 10 s while it keeps dying; a restart that fails to
  start counts as a death too. The ``RESTART_LIMIT + 1``-th death of one process within
  ``RESTART_WINDOW_S`` stops the whole serve with exit status 1 and one line saying so.
* SIGTERM or SIGINT (Ctrl-C) to the supervisor: each process gets one SIGTERM and
  drains (stops accepting, finishes its requests in flight); the supervisor exits 0 when
  all are done. A second signal is passed on too (uvicorn then stops at once).
* With ``--api-key-file``, the supervisor makes the API keys' budget table
  (:class:`~infera_core.server.budgets.SharedBudgets`) before the first fork: every
  process, restarted ones too, enforces one budget per key for the whole router.
  With ``--max-inflight-per-worker`` it makes the table of requests in flight per worker
  (:class:`~infera_core.scheduling.shared_load.SharedLoad`): the cap is the router's.
* The processes run in their own process group (Ctrl-C reaches the supervisor only, so
  each gets exactly one signal) and get SIGTERM should the supervisor die.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from typing import Any, Protocol

from infera_core.errors import InferaError
from infera_core.plugin.hooks import InferaHooks
from infera_core.scheduling.shared_load import SharedLoad
from infera_core.server.budgets import SharedBudgets
from infera_core.server.settings import ServeSettings

log = logging.getLogger("infera.server")

RESTART_LIMIT = 5
RESTART_WINDOW_S = 60.0
_PR_SET_PDEATHSIG = 1


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask, as a container's cpuset limits it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


IN_PROCESS_DISCOVERY = "memory"
"""A discovery backend whose fleet lives in one process (tests): one server process by default."""


def process_count(settings: ServeSettings) -> int:
    """``--processes``, or one per core (one with the in-process ``memory`` discovery)."""
    if settings.processes:
        return settings.processes
    return 1 if settings.discovery == IN_PROCESS_DISCOVERY else cpu_count()


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEPORT`` (not listening yet)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class ServeProcess(Protocol):
    """What one server process runs (:func:`infera_core.server.run.run_process`)."""

    def __call__(self, settings: ServeSettings, hooks: InferaHooks, **kwargs: Any) -> None: ...


def supervise(settings: ServeSettings, hooks: InferaHooks, count: int, serve: ServeProcess) -> int:
    """Run ``count`` server processes until stopped; the exit status for serve."""
    if settings.discovery == IN_PROCESS_DISCOVERY:
        raise InferaError(
            f"--processes {count} needs a discovery backend the processes share (etcd, nats, static…):"
            " the memory backend's fleet lives in one process"
        )
    if not hasattr(socket, "SO_REUSEPORT"):
        raise InferaError("--processes above 1 needs SO_REUSEPORT (Linux); use --processes 1")
    try:
        holder = reuseport_socket(settings.host, settings.port)
    except OSError as exc:
        raise InferaError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}") from None
    settings = settings.model_copy(update={"port": holder.getsockname()[1]})
    directory = tempfile.mkdtemp(prefix="infera-serve-")
    budgets = SharedBudgets(count) if settings.api_key_file is not None else None
    load = SharedLoad(count) if settings.max_inflight_per_worker > 0 else None
    try:
        return _Supervisor(settings, hooks, count, directory, budgets, load, serve).run()
    finally:
        holder.close()
        shutil.rmtree(directory, ignore_errors=True)
        if budgets is not None:
            budgets.close()
        if load is not None:
            load.close()


class _Child:
    __slots__ = ("error", "index", "pid", "ready", "ready_fd", "started")

    def __init__(self, index: int, pid: int, ready_fd: int) -> None:
        self.index = index
        self.pid = pid
        self.ready_fd = ready_fd
        self.ready = False
        self.error = ""
        self.started = time.monotonic()


class _Supervisor:
    def __init__(
        self,
        settings: ServeSettings,
        hooks: InferaHooks,
        count: int,
        directory: str,
        budgets: SharedBudgets | None,
        load: SharedLoad | None,
        serve: ServeProcess,
    ) -> None:
        self.settings = settings
        self.budgets = budgets
        self.load = load
        self.serve = serve
        self.hooks = hooks
        self.count = count
        self.directory = directory
        self.children: dict[int, _Child] = {}  # by pid
        self.signals: list[int] = []
        self.restarts: dict[int, list[float]] = {}
        self.served: set[int] = set()
        """Indexes that served once: a later failure, even at start-up, is a crash to restart."""
        self.pending: dict[int, float] = {}
        """Index → when to start it again (restarts back off: 0.5 s, doubling, at most 10 s)."""
        self.status = 0

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)

    def run(self) -> int:
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._spawn(0)
            announced = False
            forwarded = 0
            while self.children or (self.pending and not self.signals):
                self._respawn_due()
                self._poll_ready()
                if len(self.signals) > forwarded:
                    for child in self.children.values():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(child.pid, signal.SIGTERM if forwarded == 0 else signal.SIGINT)
                    if forwarded == 0:
                        log.info("draining %d server processes", len(self.children))
                    forwarded = len(self.signals)
                if not self.signals and not announced and self._all_ready():
                    announced = True
                    log.info(
                        "serving on http://%s:%d with %d processes (pids %s, discovery %s)",
                        self.settings.host,
                        self.settings.port,
                        self.count,
                        " ".join(str(c.pid) for c in sorted(self.children.values(), key=lambda c: c.index)),
                        self.settings.discovery,
                    )
                self._reap()
            return self.status
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)

    def _respawn_due(self) -> None:
        if self.signals:
            self.pending.clear()
            return
        now = time.monotonic()
        for index, when in list(self.pending.items()):
            if when <= now:
                del self.pending[index]
                self._spawn(index)

    def _all_ready(self) -> bool:
        return len(self.children) == self.count and all(c.ready for c in self.children.values())

    def _poll_ready(self) -> None:
        waiting = {c.ready_fd: c for c in self.children.values() if not c.ready}
        if not waiting:
            time.sleep(0.1)
            return
        with contextlib.suppress(InterruptedError):
            readable, _, _ = select.select(list(waiting), [], [], 0.1)
            for fd in readable:
                child = waiting[fd]
                got = os.read(fd, 65536)
                if got[:1] == b"e":  # its start-up error, printed once by the supervisor
                    child.error = got[1:].decode(errors="replace")
                if got[:1] == b"r":
                    child.ready = True
                    self.served.add(child.index)
                    os.close(fd)
                    if child.index == 0 and not self.signals:  # the rest once process 0 serves
                        for i in range(1, self.count):
                            if not any(c.index == i for c in self.children.values()):
                                self._spawn(i)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, wstatus = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is None:
                continue
            self._exited(child, wstatus)
            if not child.ready:
                with contextlib.suppress(OSError):
                    os.close(child.ready_fd)

    def _exited(self, child: _Child, wstatus: int) -> None:
        how = _describe(wstatus)
        if self.signals:
            if os.waitstatus_to_exitcode(wstatus) not in (0, -signal.SIGTERM, -signal.SIGINT):
                log.warning("server process %d (pid %d) %s while draining", child.index, child.pid, how)
            return
        if not child.ready:
            with contextlib.suppress(OSError):
                rest = os.read(child.ready_fd, 65536)
                if rest[:1] == b"e":
                    child.error = rest[1:].decode(errors="replace")
        if not child.ready and child.index not in self.served:
            # a start-up error: the process said why; the others go too
            self.status = 1
            print(
                child.error
                or f"infera-run: error: server process {child.index} {how} before it started serving",
                file=sys.stderr,
            )
            self._stop_all()
            return
        now = time.monotonic()
        recent = [t for t in self.restarts.get(child.index, []) if now - t < RESTART_WINDOW_S]
        if len(recent) >= RESTART_LIMIT:
            print(
                f"infera-run: error: server process {child.index} {how}, its {len(recent) + 1}th exit"
                f" within {RESTART_WINDOW_S:.0f} s; stopping",
                file=sys.stderr,
            )
            self.status = 1
            self._stop_all()
            return
        self.restarts[child.index] = [*recent, now]
        delay = min(0.5 * 2 ** len(recent), 10.0)
        why = f" ({child.error.removeprefix('infera-run: error: ')})" if child.error else ""
        log.warning(
            "server process %d (pid %d) %s%s; restarting it in %.1f s",
            child.index,
            child.pid,
            how,
            why,
            delay,
        )
        self.pending[child.index] = now + delay

    def _stop_all(self) -> None:
        self.signals.append(signal.SIGTERM)

    def _spawn(self, index: int) -> None:
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the server process
            os.close(read_fd)
            _child(
                self.settings,
                self.hooks,
                index,
                self.count,
                self.directory,
                write_fd,
                self.budgets,
                self.load,
                self.serve,
            )
        os.close(write_fd)
        self.children[pid] = _Child(index, pid, read_fd)


def _describe(wstatus: int) -> str:
    code = os.waitstatus_to_exitcode(wstatus)
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before prctl
        os.kill(os.getpid(), signal.SIGTERM)


def _child(
    settings: ServeSettings,
    hooks: InferaHooks,
    index: int,
    count: int,
    directory: str,
    ready_fd: int,
    budgets: SharedBudgets | None,
    load: SharedLoad | None,
    serve: ServeProcess,
) -> None:
    """Serve as process ``index``; never returns (``os._exit``)."""
    parent = os.getppid()
    code = 1
    ready = False

    def serving() -> None:
        nonlocal ready
        os.write(ready_fd, b"r")
        ready = True

    def fail(line: str) -> None:
        if ready:  # the supervisor no longer reads the pipe
            print(line, file=sys.stderr)
        else:
            with contextlib.suppress(OSError):
                os.write(ready_fd, b"e" + line.encode())

    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setpgid(0, 0)
        _die_with_parent(parent)
        from infera_core.server.peers import Peers

        serve(
            settings,
            hooks,
            sock=reuseport_socket(settings.host, settings.port),
            peers=Peers(index, count, directory, budgets=budgets, load=load),
            on_ready=serving,
        )
        code = 0
    except InferaError as exc:
        fail(f"infera-run: error: {exc}")
    except OSError as exc:
        fail(f"infera-run: error: server process {index}: {exc}")
    except KeyboardInterrupt:
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)

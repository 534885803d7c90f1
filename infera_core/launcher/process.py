"""The engine subprocess: its own process group, prefixed output, the last log lines kept,
and an environment without the launcher's secrets (:func:`engine_environment`).

Engines are spawned with :class:`subprocess.Popen` (``vfork`` + ``exec``: no code runs in
the child before the exec), not with the event loop's subprocess support: uvloop spawns
with a plain ``fork`` and runs Python's after-fork hooks in the child, which in a process
with gRPC threads (etcd) crashed sims with SIGSEGV now and then. The loop only reads the
engine's output pipe and learns of its exit through a pidfd.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable

from infera_core.engines.base import LaunchSpec
from infera_core.engines.support import engine_environment
from infera_core.errors import EngineError
from infera_core.launcher.pdeathsig import PARENT_ENV
from infera_core.launcher.root_cause import error_line

log = logging.getLogger("infera.launcher")

TAIL_LINES = 50


def _check_runnable(program: str, path: str | None, cwd: str | None) -> str | None:
    """Why ``program`` cannot be run (None when it can): checked here because the engine
    starts behind :mod:`infera_core.launcher.pdeathsig`, whose exec error would come late."""
    if os.sep in program:
        full = program if os.path.isabs(program) or cwd is None else os.path.join(cwd, program)
        if not os.path.exists(full):
            return "not installed"
        return None if os.access(full, os.X_OK) and not os.path.isdir(full) else "not executable"
    return None if shutil.which(program, path=path) else "not installed"


def _write_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class EngineProcess:
    """Spawn ``spec`` in a new session; echo its output as ``<prefix> line``."""

    def __init__(
        self,
        spec: LaunchSpec,
        prefix: str,
        *,
        engine: str,
        package_hint: str = "",
        echo: Callable[[str], None] = _write_stderr,
        tail_lines: int = TAIL_LINES,
    ) -> None:
        self.spec = spec
        self.prefix = prefix
        self.engine = engine
        self.package_hint = package_hint
        self.echo = echo
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self.root_cause: str | None = None
        """The first exception line of the output (``ValueError: …``), however long it is."""
        self.proc: subprocess.Popen[bytes] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._exit: asyncio.Task[int] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    async def start(self) -> None:
        if not self.spec.argv:
            raise EngineError(f"engine {self.engine}: the adapter built an empty command line")
        env = engine_environment(os.environ, self.spec.env)
        program = self.spec.argv[0]
        problem = _check_runnable(program, env.get("PATH"), self.spec.cwd)
        if problem == "not installed":
            hint = f"; install it: {self.package_hint}" if self.package_hint else ""
            raise EngineError(f"engine {self.engine}: {program} is not installed{hint}")
        if problem:
            raise EngineError(f"engine {self.engine}: {program} is not executable")
        env[PARENT_ENV] = str(os.getpid())
        # no Python between fork and exec (this process has gRPC threads): the wrapper
        # arms the parent-death signal, then execs the engine under the same pid
        argv = [sys.executable, "-m", "infera_core.launcher.pdeathsig", *self.spec.argv]
        self.proc = subprocess.Popen(  # noqa: ASYNC220 - vfork+exec returns at once; see the module doc
            argv,
            env=env,
            cwd=self.spec.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.info("engine %s started (pid %d): %s", self.engine, self.proc.pid, " ".join(self.spec.argv))
        loop = asyncio.get_running_loop()
        assert self.proc.stdout is not None
        stream = asyncio.StreamReader(limit=1 << 20, loop=loop)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stream, loop=loop), self.proc.stdout
        )
        self._reader = loop.create_task(self._pump(stream), name=f"engine-output-{self.engine}")
        self._exit = loop.create_task(_exit_code(self.proc), name=f"engine-exit-{self.engine}")

    async def _pump(self, stream: asyncio.StreamReader) -> None:
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line over the limit: take what is buffered
                raw = await stream.read(1 << 20)
            if not raw:
                return
            line = raw.decode(errors="replace").rstrip("\r\n")
            self.tail.append(line)
            if self.root_cause is None:
                self.root_cause = error_line(line)
            self.echo(f"{self.prefix} {line}")

    async def wait(self) -> int:
        """Wait for the process to exit and its output to be read; its exit code."""
        assert self._exit is not None
        code = await asyncio.shield(self._exit)
        if self._reader is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reader), 2.0)
        return code

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    async def stop(self, grace: float) -> int | None:
        """SIGTERM the process group; SIGKILL after ``grace`` seconds. The exit code."""
        if self.proc is None or self._exit is None:
            return None
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self._exit), grace)
            except TimeoutError:
                log.warning("engine %s did not exit %gs after SIGTERM; sending SIGKILL", self.engine, grace)
                self._signal_group(signal.SIGKILL)
                await asyncio.shield(self._exit)
        # children of the engine (workers it forked) go down with its group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        return self.proc.returncode

    def last_lines(self, n: int = 20) -> str:
        lines = list(self.tail)[-n:]
        return "\n".join(f"  {line}" for line in lines) if lines else "  (no output)"


async def _exit_code(proc: subprocess.Popen[bytes]) -> int:
    """Wait for ``proc`` to exit without blocking the loop: a pidfd turns readable then (Linux
    5.3+); elsewhere a thread waits."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return await asyncio.to_thread(proc.wait)
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await exited
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return proc.wait()

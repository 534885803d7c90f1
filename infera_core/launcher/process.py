"""The engine subprocess: its own process group, prefixed output, the last log lines kept."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
from collections import deque
from collections.abc import Callable

from infera_core.engine import LaunchSpec
from infera_core.errors import EngineError
from infera_core.launcher.pdeathsig import PARENT_ENV

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
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

    async def start(self) -> None:
        if not self.spec.argv:
            raise EngineError(f"engine {self.engine}: the adapter built an empty command line")
        env = {**os.environ, **self.spec.env}
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
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            cwd=self.spec.cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            limit=1 << 20,
        )
        log.info("engine %s started (pid %d): %s", self.engine, self.proc.pid, " ".join(self.spec.argv))
        self._reader = asyncio.get_running_loop().create_task(
            self._pump(), name=f"engine-output-{self.engine}"
        )

    async def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        stream = self.proc.stdout
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line over the limit: take what is buffered
                raw = await stream.read(1 << 20)
            if not raw:
                return
            line = raw.decode(errors="replace").rstrip("\r\n")
            self.tail.append(line)
            self.echo(f"{self.prefix} {line}")

    async def wait(self) -> int:
        """Wait for the process to exit and its output to be read; its exit code."""
        assert self.proc is not None
        code = await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reader), 2.0)
        return code

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.proc is None or self.proc.returncode is not None:
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
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            self._signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), grace)
            except TimeoutError:
                log.warning("engine %s did not exit %gs after SIGTERM; sending SIGKILL", self.engine, grace)
                self._signal_group(signal.SIGKILL)
                await self.proc.wait()
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

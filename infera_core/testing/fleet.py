"""Fixtures for fleet tests: the ``standin`` engine on PYTHONPATH, launcher subprocesses.

* :func:`standin_dist_dir` — a directory holding a dist-info whose ``infera`` entry point
  is :mod:`infera_core.testing.standin_plugin`; put it on ``PYTHONPATH`` and every
  ``infera-run`` subprocess has the ``standin`` engine.
* :func:`stop_process` — stop a subprocess with a signal, killing it if it lingers.
* :func:`read_until` — a subprocess's output up to the line a pattern matches (``up``'s ready line).
* :class:`LauncherProcess` — ``python -m infera_core worker …`` as a subprocess, its output
  collected, with ``signal``/``wait``/``output``.
* fixtures: ``standin_env`` (environment for such subprocesses) and ``launch_worker``
  (factory; every launcher it starts is killed at teardown).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from infera_core.discovery.view import FleetView
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.plugins import write_distribution
from infera_core.util import net


@contextmanager
def stopped_with_sigint(proc: subprocess.Popen[str], within: float = 60.0) -> Iterator[subprocess.Popen[str]]:
    """The block uses ``proc``; when it ends without an error, ``proc`` is stopped with SIGINT
    (Ctrl-C) and must exit 0 within ``within`` seconds. However the block ends, ``proc`` is
    killed if it still runs."""
    try:
        yield proc
        proc.send_signal(signal.SIGINT)
        assert proc.wait(within) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def stop_process(proc: subprocess.Popen[str], sig: int = signal.SIGINT, within: float = 10.0) -> None:
    """Stop ``proc`` with ``sig`` (Ctrl-C by default) unless it has exited; killed when it has
    not exited ``within`` seconds later. For ``finally`` blocks: nothing is asserted."""
    net.stop_process(proc, grace=within, sig=sig)


def read_until(proc: subprocess.Popen[str], pattern: re.Pattern[str], within: float) -> re.Match[str]:
    """Read ``proc``'s stdout (text) up to the first line matching ``pattern`` and return the
    match; AssertionError with the last lines read at EOF or after ``within`` seconds (checked
    between lines: a silent process is bounded by the test's timeout)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + within
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if found := pattern.search(line):
            return found
    raise AssertionError(f"no line matching {pattern.pattern!r} in the output:\n" + "".join(lines[-60:]))


def standin_dist_dir(base: Path) -> Path:
    """Create ``base/<dist>.dist-info`` registering the ``standin`` plugin; returns ``base``."""
    entry_points = {"standin": "infera_core.testing.standin_plugin"}
    return write_distribution(base, "infera-standin-testplugin", "0.0.0", entry_points)


def standin_environ(dist_dir: Path, **extra: str) -> dict[str, str]:
    """Environment for subprocesses: ``standin`` on PYTHONPATH, no inherited ``INFERA_*``,
    only core's and the stand-in's plugins loaded (override with ``INFERA_LOAD_PLUGINS=...``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(dist_dir), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    for key in [k for k in env if k.startswith("INFERA_")]:
        del env[key]  # the test decides every setting
    env["INFERA_LOAD_PLUGINS"] = "standin"  # core + standin only: fast start, others' plugins can't interfere
    env.update(extra)
    return env


class LauncherProcess:
    """A launcher subprocess (``infera-run worker <engine> …``) with its output collected."""

    def __init__(self, args: list[str], env: dict[str, str], module: str = "infera_core") -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:  # closed at EOF (the process exited), or the fd leaks
            for raw in self.proc.stdout:
                with self._lock:
                    self._lines.append(raw.decode(errors="replace").rstrip("\n"))

    def output(self) -> str:
        with self._lock:
            return "\n".join(self._lines)

    def wait_output(self, text: str, within: float) -> None:
        """Wait until ``text`` appears in the output (AssertionError with the output if not)."""
        deadline = time.monotonic() + within
        while text not in self.output():
            if self.proc.poll() is not None:
                self._reader.join(2)
                if text in self.output():
                    return
                raise AssertionError(
                    f"launcher exited ({self.proc.returncode}) before {text!r}:\n{self.output()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not in launcher output after {within}s:\n{self.output()}")
            time.sleep(0.05)

    async def until_output(self, text: str, within: float) -> float:
        """Async :meth:`wait_output`; returns the loop time at which ``text`` was seen."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while text not in self.output():
            if self.proc.poll() is not None:
                await asyncio.to_thread(self._reader.join, 2)
                if text in self.output():
                    break
                raise AssertionError(
                    f"launcher exited ({self.proc.returncode}) before {text!r}:\n{self.output()}"
                )
            if loop.time() > deadline:
                raise AssertionError(f"{text!r} not in launcher output after {within}s:\n{self.output()}")
            await asyncio.sleep(0.02)
        return loop.time()

    async def exited(self, within: float) -> int:
        """Async :meth:`wait`: the exit code (``TimeoutError`` after ``within`` seconds)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while self.proc.poll() is None:
            if loop.time() > deadline:
                raise TimeoutError(f"launcher still running after {within}s:\n{self.output()}")
            await asyncio.sleep(0.02)
        await asyncio.to_thread(self._reader.join, 2)
        return self.proc.returncode

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, within: float) -> int:
        code = self.proc.wait(within)
        self._reader.join(2)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture(scope="session")
def standin_pythonpath(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PYTHONPATH entry that registers the ``standin`` engine for subprocesses."""
    return standin_dist_dir(tmp_path_factory.mktemp("standin-dist"))


@pytest.fixture
def standin_env(standin_pythonpath: Path) -> dict[str, str]:
    """Environment for ``infera-run`` subprocesses that know the ``standin`` engine."""
    return standin_environ(standin_pythonpath)


@dataclass(frozen=True, slots=True)
class CliResult:
    code: int
    stdout: str
    stderr: str


def in_process_cli(
    site: Path, plugins: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., CliResult]:
    """A runner of ``infera-run`` in this process (fast) with the distributions in ``site``
    importable, only ``plugins`` (``INFERA_LOAD_PLUGINS``) loaded and no inherited ``INFERA_*``
    settings: ``run(*args, env=None, entry=None)``, ``env`` adding variables for that run and
    ``entry`` another ``main(argv)`` (a flat ``python -m infera.engine.<name>``'s)."""
    from infera_core.cli import main

    monkeypatch.syspath_prepend(str(site))
    for key in [k for k in os.environ if k.startswith("INFERA_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("INFERA_LOAD_PLUGINS", plugins)

    def run(
        *args: str, env: dict[str, str] | None = None, entry: Callable[[list[str]], None] | None = None
    ) -> CliResult:
        with monkeypatch.context() as patch:
            for key, value in (env or {}).items():
                patch.setenv(key, value)
            capsys.readouterr()
            try:
                (entry or main)(list(args))
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            out = capsys.readouterr()
        return CliResult(code, out.out, out.err)

    return run


@pytest.fixture
def infera_cli(
    standin_pythonpath: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., CliResult]:
    """``infera_cli("workers", "--json")`` runs ``infera-run`` in this process (fast) with the
    ``standin`` engine installed and no inherited ``INFERA_*`` settings; ``env=`` adds some."""
    return in_process_cli(standin_pythonpath, "standin", monkeypatch, capsys)


@pytest.fixture
def launch_worker(standin_env: dict[str, str]) -> Iterator[Callable[..., LauncherProcess]]:
    """``launch_worker("standin", "--model", "m", …)`` → a :class:`LauncherProcess` (killed at teardown)."""
    started: list[LauncherProcess] = []

    def launch(engine: str, *args: str, env: dict[str, str] | None = None) -> LauncherProcess:
        proc = LauncherProcess(["worker", engine, *args], {**standin_env, **(env or {})})
        started.append(proc)
        return proc

    yield launch
    for proc in started:
        if proc.proc.poll() is None:
            proc.signal(signal.SIGKILL)
            proc.proc.wait(5)


async def eventually(predicate: Callable[[], bool], within: float, step: float = 0.05) -> None:
    """Poll ``predicate`` until it holds; ``AssertionError`` after ``within`` seconds."""
    for _ in range(max(1, int(within / step))):
        if predicate():
            return
        await asyncio.sleep(step)
    assert predicate(), f"condition not met within {within}s"


@pytest.fixture
async def etcd_fleet(etcd_server: EtcdServer) -> AsyncIterator[FleetView]:
    """A router-side view (:class:`FleetView`) of the workers registered in ``etcd_server``."""
    from infera_core.discovery.base import DiscoverySettings
    from infera_core.discovery.etcd import EtcdDiscovery

    disc = EtcdDiscovery(DiscoverySettings(etcd_endpoints=[etcd_server.url]))
    await disc.start()
    view = FleetView(disc)
    await view.start()
    yield view
    await view.stop()
    await disc.close()

"""The engine adapter contract kit: subclass :class:`EngineAdapterContract`, set ``adapter``, run pytest.

```python
from infera_core.testing.contracts import EngineAdapterContract
from my_engine.adapter import MyAdapter

class TestMyAdapter(EngineAdapterContract):
    adapter = MyAdapter()

    def standin_replies(self, *, ready, in_flight):      # your engine's endpoints
        return {"/health": (200 if ready else 503, ""),
                "/metrics": (200, f"my_engine_running {in_flight}\\n")}
```

Besides identity, options, the launch spec and the record fields, the kit runs the
adapter's checks against a stand-in of the engine (a loopback HTTP server answering what
:meth:`~EngineAdapterContract.standin_replies` says): ``is_ready`` must say False when
nothing listens and while the engine starts, True once it serves; ``in_flight`` must
report the stand-in's count (or always None, with ``reports_in_flight = False``). An
option spelled like a launcher flag (``port``, ``model``, ``role``…) is refused.
Importing this module has no side effects.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Awaitable, Iterator, Mapping
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from typing import Any, ClassVar, TypeVar

from infera_core.engines.base import (
    EngineAdapter,
    EngineOption,
    LaunchContext,
    LaunchSpec,
    RecordFields,
    RunningEngine,
)
from infera_core.launcher.record import launch_record as launch_record_of
from infera_core.testing.http_handler import QuietHandler
from infera_core.util.net import free_port
from infera_core.worker import KvEventsInfo, PdInfo, Role, WorkerRecord

__all__ = [
    "EngineAdapterContract",
    "Reply",
    "StandinEndpoints",
    "closed_port",
    "launch_record",
    "sample_launch_context",
]

ENGINE_MODULES = ("torch", "vllm", "sglang", "atom")
"""Packages no plugin module may import at import time."""

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
IDENT_RE = re.compile(r"^[a-z_][a-z0-9_]*$")

Reply = tuple[int, str]
"""An HTTP status and a body (JSON bodies are sent as ``application/json``)."""

T = TypeVar("T")


def sample_launch_context(**overrides: Any) -> LaunchContext:
    """A plausible :class:`LaunchContext` for a mixed worker on loopback."""
    ports = iter(range(41000, 41100))
    values: dict[str, Any] = {
        "worker_id": "w-contract-0",
        "model": "contract-model",
        "model_path": None,
        "role": Role.MIXED,
        "host": "127.0.0.1",
        "port": 40999,
        "advertise_host": "127.0.0.1",
        "engine_args": [],
        "options": {},
        "free_port": lambda: next(ports),
    }
    values.update(overrides)
    return LaunchContext(**values)


def launch_record(adapter: EngineAdapter, ctx: LaunchContext, **overrides: Any) -> WorkerRecord:
    """The worker record a launcher registers for ``ctx``: its URL and role and every field of
    ``adapter.record_fields(ctx)``; ``overrides`` replace fields (``kv_events=None``…)."""
    record = launch_record_of(adapter, ctx)
    return record.model_copy(update=overrides) if overrides else record


class StandinEndpoints:
    """A loopback HTTP server answering ``replies[path]`` (query ignored; 404 otherwise) to
    GET and POST; assign :attr:`replies` to change what it says. ``with`` starts and stops it."""

    def __init__(self, replies: Mapping[str, Reply]) -> None:
        self.replies: Mapping[str, Reply] = replies
        self.requests: list[str] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.server_address[1])

    def _handler(self) -> type[QuietHandler]:
        owner = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                path = self.path.split("?", 1)[0]
                owner.requests.append(f"{self.command} {path}")
                status, body = owner.replies.get(path, (404, ""))
                is_json = body.lstrip().startswith(("{", "["))
                self.reply(status, body, "application/json" if is_json else "text/plain")

            do_GET = _answer
            do_POST = _answer

        return Handler

    def __enter__(self) -> StandinEndpoints:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="standin-endpoints", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound and released at once)."""
    return free_port("127.0.0.1")


async def _answer_or(call: Awaitable[T], default: T) -> T:
    """What the launcher makes of a check: an exception counts as ``default``."""
    try:
        return await call
    except Exception:
        return default


class EngineAdapterContract:
    """An engine adapter: identity, options, launch spec, record fields and its checks on a
    running engine (against a stand-in) are well formed."""

    adapter: ClassVar[Any]
    """An instance of your adapter (what ``infera_register_engines`` adds)."""
    reports_in_flight: ClassVar[bool] = True
    """False when your engine has no in-flight count (``in_flight`` always None: every drain
    then waits the whole ``--drain-timeout``)."""

    def launch_context(self) -> LaunchContext:
        """The context used for ``build_launch``; override to set required options."""
        defaults = {o.name: o.default for o in self.adapter.options()}
        return sample_launch_context(options=defaults)

    def standin_replies(self, *, ready: bool, in_flight: int) -> Mapping[str, Reply]:
        """What a stand-in of your engine answers (path → (status, body)) while it starts
        (``ready=False``) or serves with ``in_flight`` requests running.

        The default speaks vLLM's endpoints (``/health``, ``vllm:num_requests_running`` on
        ``/metrics``); override it with your engine's own (real paths, real metric names)."""
        metrics = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="contract-model"}} {float(in_flight)}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="contract-model"} 0.0\n'
        )
        if not ready:
            return {"/health": (503, "")}
        return {"/health": (200, ""), "/metrics": (200, metrics)}

    def test_satisfies_protocol(self) -> None:
        assert isinstance(self.adapter, EngineAdapter), "adapter lacks EngineAdapter methods"

    def test_identity(self) -> None:
        a = self.adapter
        assert isinstance(a.name, str) and NAME_RE.match(a.name), f"bad engine name {a.name!r}"
        assert isinstance(a.description, str) and a.description.strip(), "adapter needs a description"
        assert isinstance(a.package_hint, str) and a.package_hint.strip(), "adapter needs a package_hint"

    def test_options(self) -> None:
        opts = list(self.adapter.options())
        names = []
        for o in opts:
            assert isinstance(o, EngineOption), f"option {o!r} is not an EngineOption"
            assert IDENT_RE.match(o.name), f"option name {o.name!r} must be a python identifier"
            names.append(o.name)
            if o.choices is not None and o.default is not None:
                assert o.default in o.choices, f"default of {o.flag} not among its choices"
        dupes = sorted({n for n in names if names.count(n) > 1})
        assert not dupes, f"duplicate option names: {dupes}"

    def test_options_do_not_clash_with_launcher_flags(self) -> None:
        from infera_core.engines.base import OPTION_CLASH_HINT, option_clashes
        from infera_core.plugin.settings import launcher_flags

        clashes = option_clashes(self.adapter, launcher_flags(self._catalog()))
        assert not clashes, (
            f"engine {self.adapter.name!r}: options named like launcher flags: {', '.join(clashes)}; "
            "the catalog refuses the plugin at load (the launcher's flag would win and yours "
            f"could never be set): {OPTION_CLASH_HINT}"
        )

    def _catalog(self) -> Any:
        """The installed plugins' catalog (their backends add launcher flags); None when it cannot load."""
        from infera_core.plugin.hooks import InferaHooks

        try:
            return InferaHooks.load().catalog()
        except Exception:
            return None

    def test_build_launch(self) -> None:
        spec = self.adapter.build_launch(self.launch_context())
        assert isinstance(spec, LaunchSpec), f"build_launch returned {type(spec).__name__}"
        assert spec.argv and all(isinstance(a, str) for a in spec.argv), f"argv must be strings: {spec.argv}"
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in spec.env.items()), "env must be str"
        assert spec.engine_version is None or isinstance(spec.engine_version, str), "engine_version: str"

    def test_record_fields(self) -> None:
        ctx = self.launch_context()
        fields = self.adapter.record_fields(ctx)
        assert isinstance(fields, RecordFields), f"record_fields returned {type(fields).__name__}"
        if fields.kv_events is not None:
            assert isinstance(fields.kv_events, KvEventsInfo), "kv_events must be a KvEventsInfo"
            KvEventsInfo.model_validate(fields.kv_events.model_dump())
        if fields.pd is not None:
            assert isinstance(fields.pd, PdInfo), "pd must be a PdInfo"
            PdInfo.model_validate(fields.pd.model_dump())
        record = launch_record(self.adapter, ctx)
        assert WorkerRecord.from_json(record.to_json()) == record

    def test_launch_state_lives_in_the_context(self) -> None:
        """A launch's record fields stay put: on a second call, and after another launch of the
        same adapter instance (per-launch ports belong in ``ctx.ports``, not on the adapter)."""
        first, second = self.launch_context(), self.launch_context()
        others = iter(range(42000, 42100))
        second.worker_id, second.free_port = first.worker_id + "-b", lambda: next(others)
        self.adapter.build_launch(first)
        before = self.adapter.record_fields(first)
        assert self.adapter.record_fields(first) == before, (
            "record_fields gave another answer for the same launch: pick ports once, into ctx.ports"
        )
        self.adapter.build_launch(second)
        assert self.adapter.record_fields(first) == before, (
            "record_fields of a launch changed after another launch: keep per-launch state in "
            "ctx.ports / the LaunchSpec, not on the adapter"
        )

    def test_readiness_and_in_flight_against_a_standin(self) -> None:
        asyncio.run(self._check_readiness_and_in_flight())

    @contextmanager
    def _standin(self, ready: bool, in_flight: int) -> Iterator[tuple[StandinEndpoints, LaunchContext]]:
        with StandinEndpoints(self.standin_replies(ready=ready, in_flight=in_flight)) as server:
            ctx = self.launch_context()
            ctx.port = server.port
            ctx.host = ctx.advertise_host = "127.0.0.1"
            self.adapter.build_launch(ctx)  # as the launcher does: per-launch state first
            yield server, ctx

    async def _check_readiness_and_in_flight(self) -> None:
        import httpx

        name = self.adapter.name
        async with httpx.AsyncClient(timeout=httpx.Timeout(5.0), trust_env=False) as client:
            down = self.launch_context()
            down.port, down.host, down.advertise_host = closed_port(), "127.0.0.1", "127.0.0.1"
            gone = RunningEngine(down, client)
            assert not await _answer_or(self.adapter.is_ready(gone), False), (
                f"{name}: is_ready said True with nothing listening at {gone.url}"
            )
            with self._standin(ready=False, in_flight=0) as (server, ctx):
                engine = RunningEngine(ctx, client)
                assert engine.url == f"http://127.0.0.1:{server.port}"
                assert not await _answer_or(self.adapter.is_ready(engine), False), (
                    f"{name}: is_ready said True while the engine starts "
                    f"(stand-in answering {dict(server.replies)})"
                )
                for count in (0, 3, 0):
                    server.replies = self.standin_replies(ready=True, in_flight=count)
                    assert await _answer_or(self.adapter.is_ready(engine), False), (
                        f"{name}: is_ready said False for a serving engine (stand-in answering "
                        f"{dict(server.replies)}; requests seen: {server.requests[-4:]})"
                    )
                    got = await _answer_or(self.adapter.in_flight(engine), None)
                    want = count if self.reports_in_flight else None
                    assert got == want, (
                        f"{name}: in_flight said {got!r} with {count} requests running, expected {want!r}"
                        + (
                            ""
                            if self.reports_in_flight
                            else " (reports_in_flight = False: it should always be None)"
                        )
                    )

    def test_module_imports_no_engine(self) -> None:
        module = type(self.adapter).__module__
        code = textwrap.dedent(
            f"""
            import importlib, sys
            importlib.import_module({module!r})
            print(",".join(m for m in {ENGINE_MODULES!r} if m in sys.modules))
            """
        )
        # the child sees the same import path (test modules, editable installs)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False, env=env
        )
        assert out.returncode == 0, f"importing {module} failed: {out.stderr.strip()[-500:]}"
        assert not out.stdout.strip(), f"importing {module} imported {out.stdout.strip()}"

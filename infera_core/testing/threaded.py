"""A server with stand-in workers in a background thread, for blocking clients (fuzzers).

with served_in_thread(workers=2) as srv:     # the server's own event loop runs in a thread
    httpx.post(srv.url + "/v1/chat/completions", json=...)
    assert not srv.errors                    # nothing logged at ERROR / no traceback
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for
from infera_core.testing.upstream import fake_upstreams, record_for


class _Collect(logging.Handler):
    """Keeps every record at ERROR or above, and every record carrying a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(record)


class ThreadedServer:
    def __init__(self, url: str, model: str, handler: _Collect) -> None:
        self.url = url
        self.model = model
        self._handler = handler

    @property
    def errors(self) -> list[str]:
        """Log lines at ERROR (or with a traceback) since the server started."""
        return [self._handler.format(r) for r in self._handler.records]


@contextlib.contextmanager
def served_in_thread(
    workers: int = 2, model: str = "fake-model", within: float = 20.0, **settings: Any
) -> Iterator[ThreadedServer]:
    """Serve (memory discovery, ``workers`` stand-in upstreams of ``model``) until the block exits."""
    handler = _Collect()
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    loggers = [logging.getLogger(), logging.getLogger("uvicorn")]  # uvicorn's does not propagate
    for logger in loggers:
        logger.addHandler(handler)
    started = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        stop = asyncio.Event()
        box["stop"] = stop
        box["loop"] = asyncio.get_running_loop()
        async with (
            fake_upstreams(workers, model) as ups,
            serving(settings_for(**settings), make_hooks()) as srv,
        ):
            for up in ups:
                srv.store.put(record_for(up))
            await srv.wait_workers(len(ups))
            box["url"] = srv.url
            started.set()
            await stop.wait()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # reported to the waiting thread
            box["error"] = exc
            started.set()

    thread = threading.Thread(target=run, name="infera-test-server", daemon=True)
    thread.start()
    try:
        if not started.wait(within) or "error" in box:
            raise RuntimeError(f"the server did not start: {box.get('error')!r}")
        yield ThreadedServer(box["url"], model, handler)
    finally:
        loop = box.get("loop")
        if loop is not None and "stop" in box and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(box["stop"].set)
        thread.join(within)
        for logger in loggers:
            logger.removeHandler(handler)


def report_line(request: Any, line: str) -> None:
    """Write ``line`` to pytest's output even while output is captured (``request``: a pytest
    ``FixtureRequest``), e.g. how many inputs a fuzz test tried."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is None or reporter is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("\n" + line)

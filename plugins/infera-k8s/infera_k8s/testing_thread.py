"""The stand-in API server on its own event loop in a thread, for synchronous callers (a
bench, a test that starts ``infera-run serve`` processes against it)."""

from __future__ import annotations

import asyncio
import threading

from infera_k8s.testing import StandinApiServer

START_TIMEOUT_S = 10.0


class StandinInThread:
    """``start()``, ``url``, ``close()``; :attr:`server` is the stand-in (touch it only
    through :meth:`call` while it runs: it lives on the thread's loop)."""

    def __init__(self) -> None:
        self.server = StandinApiServer()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="k8s-standin", daemon=True)

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(START_TIMEOUT_S)

    def close(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.server.close(), self._loop).result(START_TIMEOUT_S)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(START_TIMEOUT_S)
        self._loop.close()

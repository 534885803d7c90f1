"""Relaying a stream leg by leg: the first worker's, then each continuation's.

:func:`relay_legs` reads a worker's SSE stream and hands its bytes to ``emit`` (which sends
them to the client, as they are or translated); when the stream breaks after its first
byte, or is cut by the router (:mod:`infera_core.server.resume`), it resumes it on another
worker and goes on with that worker's stream, its chunks rewritten into the first one's
(:class:`~infera_core.server.migrate.Resumed`). A migratable stream is relayed in whole
SSE events only, and each is kept, so that the router knows exactly what the client has.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from infera_core.request import RequestContext
from infera_core.scheduling.types import Endpoint
from infera_core.server.core import RouterCore
from infera_core.server.migrate import Relayed, whole_events
from infera_core.server.resume import Leg, LiveStream, Migrator, uncancel
from infera_core.server.splice import StreamTally
from infera_core.transports.http.http1 import Http1Response
from infera_core.transports.upstreams import READ_ERRORS, UpstreamResponse

log = logging.getLogger("infera.server.proxy")

DONE = b"data: [DONE]\n\n"

Emit = Callable[[bytes], Awaitable[None]]


class Broken(Exception):
    """The stream broke and was not continued: ``message`` says why (for the error event)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


async def relay_legs(
    core: RouterCore,
    mig: Migrator | None,
    live: LiveStream | None,
    ctx: RequestContext,
    path: str,
    chat: bool,
    resp: UpstreamResponse,
    worker: str,
    emit: Emit,
    kept: list[bytes] | None,
    sink: StreamTally | None = None,
) -> None:
    """Relay ``resp`` (and its continuations) through ``emit``; :class:`Broken` when it broke
    and could not go on. ``kept``: the relayed events of a migratable stream (``live``);
    ``sink``: the native transport's direct writer for the first leg (it keeps its own)."""
    leg: Leg | None = None
    failed = [worker]
    ok = False
    if live is not None and sink is not None:
        live.tally = sink
    try:
        while True:
            try:
                await _pump(mig, live, ctx, leg.resp if leg else resp, emit, kept, sink, leg)
                ok = True
                return
            except READ_ERRORS as exc:
                reason, what = "upstream_closed", repr(exc)
            except asyncio.CancelledError:
                if live is None or live.cut is None or uncancel() > 0:
                    raise
                reason = live.cut
                what = f"its stream was moved ({reason})"
            now = failed[-1]
            log.warning("request %s: worker %s failed mid-stream: %s", ctx.log_id, now, what)
            if sink is not None:
                resp.sink = None  # type: ignore[attr-defined]
                sink = None
            if leg is not None:
                _end_leg(core, leg, False)
                leg = None
            else:
                resp.release()
            got: Leg | Relayed | str = ""
            if live is not None and live.refused is not None:
                got = live.refused
            elif mig is not None and live is not None and kept is not None:
                got = await mig.resume(ctx, path, b"".join(kept), live, failed, reason, chat)
            if isinstance(got, Leg):
                leg = got
                failed.append(leg.ep.worker_id)
                continue
            if isinstance(got, Relayed):  # the answer was whole: only its end was lost
                if not got.done:
                    await emit(DONE)
                ok = True
                return
            note = f" (not continued elsewhere: {got})" if got else ""
            if got:
                log.warning("request %s: its stream was not continued: %s", ctx.log_id, got)
            raise Broken(f"Worker {now} failed mid-stream: {what}{note}")
    finally:
        if sink is not None:
            resp.sink = None  # type: ignore[attr-defined]
        if leg is not None:
            _end_leg(core, leg, ok)


def _end_leg(core: RouterCore, leg: Leg, ok: bool) -> None:
    leg.resp.release()
    core.release(leg.ctx, leg.ep, ok)


async def _pump(
    mig: Migrator | None,
    live: LiveStream | None,
    ctx: RequestContext,
    resp: UpstreamResponse,
    emit: Emit,
    kept: list[bytes] | None,
    sink: StreamTally | None,
    leg: Leg | None,
) -> None:
    """Relay one worker's stream (a migratable one in whole events, kept)."""
    pending = b""
    if sink is not None:
        assert isinstance(resp, Http1Response)
        resp.sink = sink
    async for chunk in resp:
        if sink is not None:
            resp.sink = None  # type: ignore[attr-defined]  # until this chunk is out: none may overtake it
        if leg is not None:
            chunk = leg.resumed.feed(chunk)
        elif kept is not None:
            chunk, pending = whole_events(pending, chunk)
        if live is not None:
            live.last = time.perf_counter()
        if chunk:
            if kept is not None:
                kept.append(chunk)
            await emit(chunk)
            if leg is not None and leg.started and mig is not None:
                mig.resumed(ctx, leg)
                leg.started = 0.0
        if sink is not None and not pending:
            resp.sink = sink  # type: ignore[attr-defined]


class Whole:
    """A non-streamed answer read whole: its bytes, status, content type and worker."""

    __slots__ = ("content_type", "data", "status", "worker")

    def __init__(self, data: bytes, status: int, content_type: str, worker: str) -> None:
        self.data = data
        self.status = status
        self.content_type = content_type
        self.worker = worker


async def read_whole(
    core: RouterCore,
    mig: Migrator | None,
    ctx: RequestContext,
    path: str,
    resp: UpstreamResponse,
    worker: str,
) -> Whole:
    """The answer of a non-streamed request; when reading it breaks, the request is sent again,
    whole, to another worker (up to the migration limit). :class:`Broken` when it cannot be."""
    left = mig.whole_retries(ctx) if mig is not None else 0
    failed = [worker]
    current = resp
    again: tuple[RequestContext, Endpoint] | None = None
    try:
        while True:
            try:
                data = await current.read()
            except READ_ERRORS as exc:
                log.warning("request %s: worker %s failed while responding: %r", ctx.log_id, failed[-1], exc)
                current.release()
                if again is not None:
                    core.release(again[0], again[1], False)
                    again = None
                if mig is None or left <= 0:
                    raise Broken(f"Worker {failed[-1]} failed while responding: {exc!r}") from None
                left -= 1
                got = await mig.retry_whole(ctx, path, failed)
                if isinstance(got, str):
                    raise Broken(f"Worker {failed[-1]} failed while responding: {exc!r} ({got})") from None
                again = got[0], got[1]
                current = got[2]
                failed.append(got[1].worker_id)
                continue
            ctype = current.content_type or "application/json"
            out = Whole(data, current.status, ctype, failed[-1])
            if again is not None:
                current.release()
                core.release(again[0], again[1], current.status < 400)
                again = None
            return out
    finally:
        if again is not None:  # cancelled (the client left)
            current.release()
            core.release(again[0], again[1], False)

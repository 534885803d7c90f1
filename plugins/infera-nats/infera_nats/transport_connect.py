"""One NATS connection for a transport component (router upstream, responder, KV relay or consumer).

Connects within ``connect_timeout`` (else :class:`NatsUnreachableError`, one clear line),
then reconnects forever with a short wait; the callbacks say when the connection drops
and comes back. Connection errors during reconnects are logged once per outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import nats
from nats.aio.client import Client
from nats.errors import SlowConsumerError

from infera_core.util.redact import redact_url
from infera_nats.auth import NatsAuth, NatsAuthError

log = logging.getLogger("infera.nats")

RECONNECT_WAIT_S = 0.25


class NatsUnreachableError(ConnectionError):
    """No NATS server answered within the connect timeout."""


def split_servers(urls: str | list[str]) -> list[str]:
    """``nats://a:4222,nats://b:4222`` (or a list of such strings) as a list of URLs."""
    items = urls if isinstance(urls, list) else [urls]
    return [u.strip() for item in items for u in item.split(",") if u.strip()]


async def connect_nats(
    servers: str | list[str],
    name: str,
    connect_timeout: float,
    *,
    on_disconnect: Callable[[], None] | None = None,
    on_reconnect: Callable[[], None] | None = None,
    on_slow_consumer: Callable[[SlowConsumerError], None] | None = None,
    pending_size: int = 8 * 1024 * 1024,
    auth: NatsAuth | None = None,
) -> Client:
    """``auth``: the credentials (none: an open server, or credentials in the URL)."""
    urls = split_servers(servers)
    auth = auth or NatsAuth()
    try:
        options = auth.connect_options()
    except NatsAuthError as exc:
        raise NatsUnreachableError(str(exc)) from None
    if not urls:
        raise NatsUnreachableError("no NATS server URL given (--nats-url, env INFERA_NATS_URL)")
    outage = [True]  # errors before the first connection are in the one error raised below
    last_error: list[BaseException] = []
    refused: list[BaseException] = []

    async def error_cb(exc: Exception) -> None:
        if isinstance(exc, SlowConsumerError):
            if on_slow_consumer is not None:
                on_slow_consumer(exc)
            return
        last_error[:] = [exc]
        if _refused(exc):
            refused[:] = [exc]  # kept: the server closes the connection after saying so
        if not outage[0]:
            outage[0] = True
            log.warning("%s: NATS connection error: %s", name, exc or type(exc).__name__)

    async def disconnected_cb() -> None:
        if on_disconnect is not None:
            on_disconnect()

    async def reconnected_cb() -> None:
        outage[0] = False
        log.info("%s: NATS reconnected", name)
        if on_reconnect is not None:
            on_reconnect()

    nc = Client()
    try:
        async with asyncio.timeout(connect_timeout):
            await nc.connect(
                servers=urls,
                name=name,
                connect_timeout=max(1, int(connect_timeout)),
                max_reconnect_attempts=-1,
                reconnect_time_wait=RECONNECT_WAIT_S,  # type: ignore[arg-type]  # seconds, float works
                error_cb=error_cb,
                disconnected_cb=disconnected_cb,
                reconnected_cb=reconnected_cb,
                pending_size=pending_size,
                **options,
            )
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        with contextlib.suppress(Exception):
            await nc.close()
        shown = ", ".join(redact_url(u) for u in urls)
        cause = last_error[0] if last_error else exc
        if refused or _refused(cause):
            raise NatsUnreachableError(
                f"NATS at {shown} refused the credentials ({auth.describe()}): {(refused or [cause])[0]}; check"
                " --nats-user/--nats-password, --nats-creds, --nats-nkey-seed or --nats-tls-cert"
            ) from None
        raise NatsUnreachableError(
            f"NATS at {shown} did not answer within {connect_timeout:g} s ({cause or type(cause).__name__})"
        ) from None
    outage[0] = False
    return nc


def _refused(exc: BaseException) -> bool:
    """The server said the credentials are wrong (or missing)."""
    text = str(exc).lower()
    return (
        isinstance(exc, nats.errors.AuthorizationError) or "authorization" in text or "authentication" in text
    )


async def close_quietly(nc: Client | None, drain: Callable[[Client], Awaitable[None]] | None = None) -> None:
    if nc is None or nc.is_closed:
        return
    with contextlib.suppress(Exception):
        if drain is not None:
            await drain(nc)
        await nc.close()

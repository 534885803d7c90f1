"""A thin layer over ``aetcd``: endpoint parsing, connect with failover, fast reconnects."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import aetcd

from infera_core.errors import DiscoveryError

log = logging.getLogger("infera.discovery.etcd")

DEFAULT_PORT = 2379

# gRPC reconnects with exponential backoff up to 2 minutes by default; after an etcd
# restart we want the watch and the keepalives back within a second or so.
GRPC_OPTIONS: dict[str, Any] = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.enable_http_proxy": 0,
    # notice a silently dead connection (no RST) within ~15 s; etcd allows pings every 5 s
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.http2.max_pings_without_data": 0,
}

# What a failed etcd call can raise: aetcd's own errors, gRPC errors it did not wrap,
# timeouts, and OS errors from the channel.
ETCD_ERRORS: tuple[type[BaseException], ...] = (
    aetcd.ClientError,
    aetcd.rpc.RpcError,
    aetcd.rpc.BaseError,
    TimeoutError,
    OSError,
    ValueError,
)


def parse_endpoints(values: Iterable[str]) -> list[tuple[str, int]]:
    """``host:port``, ``http://host:port``, ``host`` (port 2379), comma lists → (host, port)."""
    out: list[tuple[str, int]] = []
    for value in values:
        for raw in value.split(","):
            item = raw.strip()
            if not item:
                continue
            if "://" in item:
                scheme, _, item = item.partition("://")
                if scheme != "http":
                    raise DiscoveryError(
                        f"--etcd-endpoint {raw.strip()!r}: only http:// endpoints are supported (no TLS)"
                    )
            item = item.rstrip("/")
            host, sep, port_s = item.rpartition(":")
            if not sep or "]" in port_s:
                host, port_s = item, str(DEFAULT_PORT)
            host = host.strip("[]")
            try:
                port = int(port_s)
            except ValueError:
                raise DiscoveryError(
                    f"--etcd-endpoint {raw.strip()!r}: port {port_s!r} is not a number"
                ) from None
            if not host or not 0 < port < 65536:
                raise DiscoveryError(f"--etcd-endpoint {raw.strip()!r}: expected host:port")
            out.append((host, port))
    return out


def describe(endpoints: list[tuple[str, int]]) -> str:
    return ", ".join(f"{h}:{p}" for h, p in endpoints)


class EtcdConnection:
    """One ``aetcd.Client`` to the first reachable endpoint; :meth:`failover` moves on."""

    def __init__(self, endpoints: list[tuple[str, int]], timeout: float) -> None:
        if not endpoints:
            raise DiscoveryError(
                "--discovery etcd needs --etcd-endpoint HOST:PORT (env INFERA_ETCD_ENDPOINT)"
            )
        self.endpoints = endpoints
        self.timeout = timeout
        self._index = 0
        self._client: aetcd.Client | None = None
        self._lock = asyncio.Lock()

    @property
    def client(self) -> aetcd.Client:
        if self._client is None:
            raise DiscoveryError("etcd discovery is not started")
        return self._client

    @property
    def endpoint(self) -> str:
        host, port = self.endpoints[self._index]
        return f"{host}:{port}"

    def _new_client(self, index: int) -> aetcd.Client:
        host, port = self.endpoints[index]
        return aetcd.Client(host=host, port=port, timeout=self.timeout, options=GRPC_OPTIONS)  # type: ignore[arg-type]

    async def connect(self) -> None:
        """Connect to the first endpoint that answers; one clear error if none does."""
        errors: list[str] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        for offset in range(len(self.endpoints)):
            index = (self._index + offset) % len(self.endpoints)
            client = self._new_client(index)
            try:
                async with asyncio.timeout(max(0.1, deadline - loop.time())):
                    await client.status()
            except ETCD_ERRORS as exc:
                errors.append(f"{self.endpoints[index][0]}:{self.endpoints[index][1]}: {_why(exc)}")
                await _close_quietly(client)
                continue
            old, self._client, self._index = self._client, client, index
            if old is not None:
                await _close_quietly(old)
            return
        raise DiscoveryError(
            f"cannot reach etcd ({'; '.join(errors)}) within {self.timeout:g}s; "
            "check --etcd-endpoint (env INFERA_ETCD_ENDPOINT) and that etcd is running"
        )

    async def failover(self) -> None:
        """After repeated failures with several endpoints: try the next one (best effort)."""
        if len(self.endpoints) < 2:
            return
        async with self._lock:
            self._index = (self._index + 1) % len(self.endpoints)
            try:
                await self.connect()
            except DiscoveryError as exc:
                log.warning("etcd failover: %s", exc)

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await _close_quietly(client)


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]


async def _close_quietly(client: aetcd.Client) -> None:
    try:
        await client.close()
    except Exception as exc:
        log.debug("closing etcd client: %s", exc)

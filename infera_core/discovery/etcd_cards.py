"""Model cards in etcd: content-addressed, chunked, kept while a worker record names them.

Layout, beside the workers' prefix (``/infera/workers/`` → ``/infera/cards/``)::

    /infera/cards/<digest>/meta        {"size": N, "chunks": K}
    /infera/cards/<digest>/c/00000     the card's bytes, 1 MiB per chunk (etcd refuses
    /infera/cards/<digest>/c/00001     requests over 1.5 MiB by default)

The keys carry no lease (several workers share one card). A launcher, after it has
registered, touches ``meta`` and then writes the chunks; after it deregisters it deletes
the card in one transaction *if* no worker record names the digest and ``meta`` was not
touched since it looked. A worker registering meanwhile either touched ``meta`` after that
look (the delete fails) or registered before it (the look sees its record), so a live
worker's card is never dropped. A worker that dies without deregistering leaves its card
behind until the next worker of that digest deregisters (``etcdctl del --prefix
/infera/cards/<digest>`` removes it by hand).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from aetcd import utils

from infera_core.discovery.etcd_client import ETCD_ERRORS, EtcdConnection
from infera_core.errors import DiscoveryError
from infera_core.worker import WorkerRecord

CHUNK = 1 << 20


def cards_prefix(workers_prefix: str) -> str:
    """``/infera/workers/`` → ``/infera/cards/`` (the parent of the workers' prefix + ``cards/``)."""
    parent = workers_prefix.rstrip("/").rpartition("/")[0]
    return parent + "/cards/"


class EtcdCards:
    """Put, get and release model cards (see the module docstring)."""

    def __init__(
        self,
        conn: EtcdConnection,
        workers_prefix: str,
        list_records: Callable[[], Awaitable[list[WorkerRecord]]],
    ) -> None:
        self.conn = conn
        self.prefix = cards_prefix(workers_prefix)
        self._list = list_records

    def _meta(self, digest: str) -> bytes:
        return f"{self.prefix}{digest}/meta".encode()

    def _chunks(self, digest: str) -> bytes:
        return f"{self.prefix}{digest}/c/".encode()

    async def put(self, digest: str, data: bytes) -> None:
        client = self.conn.client
        n = max(1, -(-len(data) // CHUNK))
        meta = json.dumps({"size": len(data), "chunks": n}).encode()
        try:
            await client.put(self._meta(digest), meta)  # touch first: see the module docstring
            for i in range(n):
                await client.put(self._chunks(digest) + b"%05d" % i, data[i * CHUNK : (i + 1) * CHUNK])
        except ETCD_ERRORS as exc:
            raise DiscoveryError(f"etcd: cannot store model card {digest}: {exc}") from exc

    async def get(self, digest: str, max_bytes: int) -> bytes | None:
        client = self.conn.client
        try:
            meta = await client.get(self._meta(digest))
        except ETCD_ERRORS as exc:
            raise DiscoveryError(f"etcd: cannot read model card {digest}: {exc}") from exc
        if meta is None:
            return None
        try:
            size = int(json.loads(meta.value)["size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"model card {digest}: malformed meta ({exc})") from None
        if size > max_bytes:
            raise ValueError(f"model card {digest} is {size} bytes, over the limit of {max_bytes}")
        try:
            chunks = await client.get_prefix(self._chunks(digest))
        except ETCD_ERRORS as exc:
            raise DiscoveryError(f"etcd: cannot read model card {digest}: {exc}") from exc
        parts = sorted((kv.key, kv.value) for kv in chunks)
        data = b"".join(v for _, v in parts)
        return data if len(data) == size else None  # None: still being written

    async def release(self, digest: str) -> None:
        client = self.conn.client
        meta = await client.get(self._meta(digest))
        if meta is None:
            return
        records = await self._list()
        if any(r.model_card is not None and r.model_card.digest == digest for r in records):
            return
        tx = client.transactions
        prefix = f"{self.prefix}{digest}/".encode()
        await client.transaction(
            compare=[tx.mod(self._meta(digest)) == meta.mod_revision],
            success=[tx.delete(prefix, utils.prefix_range_end(prefix))],
            failure=[],
        )

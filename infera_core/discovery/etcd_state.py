"""Shared records in etcd (:class:`~infera_core.discovery.base.SharedState`): one key per
record beside the workers' prefix (``/infera/workers/`` → ``/infera/state/<name>``), written
by a transaction that compares the key's ``mod_revision`` (0: absent). No lease: the
records outlive the routers that wrote them."""

from __future__ import annotations

from infera_core.discovery.etcd_client import EtcdConnection


def state_prefix(workers_prefix: str) -> str:
    """``/infera/workers/`` → ``/infera/state/``."""
    return workers_prefix.rstrip("/").rpartition("/")[0] + "/state/"


class EtcdState:
    """Get and compare-and-swap records under :func:`state_prefix`."""

    def __init__(self, conn: EtcdConnection, workers_prefix: str) -> None:
        self.conn = conn
        self.prefix = state_prefix(workers_prefix)

    async def get(self, name: str) -> tuple[bytes | None, int]:
        got = await self.conn.client.get(f"{self.prefix}{name}".encode())
        if got is None:
            return None, 0
        return bytes(got.value), int(got.mod_revision)

    async def swap(self, name: str, value: bytes, revision: int) -> bool:
        client = self.conn.client
        key = f"{self.prefix}{name}".encode()
        tx = client.transactions
        ok, _ = await client.transaction(
            compare=[tx.mod(key) == revision], success=[tx.put(key, value)], failure=[]
        )
        return bool(ok)

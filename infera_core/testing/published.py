"""What a launched worker publishes, read back the way a router would: its record in etcd
(:func:`etcd_workers`, :func:`wait_registered`) and its KV events (:class:`KvSubscriber`)."""

from __future__ import annotations

import asyncio
import time

import zmq

from infera_core.discovery.base import DiscoverySettings
from infera_core.discovery.etcd import EtcdDiscovery
from infera_core.errors import DiscoveryError
from infera_core.kv.events import BlockStored, KvEventDecoder
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.fleet import LauncherProcess
from infera_core.worker import WorkerRecord

START_TIMEOUT = 420.0
"""How long :func:`wait_registered` waits by default: vLLM starts in 20-60 s on an idle 2-core
machine; much slower when the cores are shared."""


def etcd_workers(etcd: EtcdServer) -> dict[str, WorkerRecord]:
    """The workers registered in ``etcd`` now (a fresh client: connecting may take a while
    while engines start on the same loaded cores, hence the generous connect timeout)."""

    async def read() -> list[WorkerRecord]:
        settings = DiscoverySettings(etcd_endpoints=[etcd.endpoint], connect_timeout=30.0)
        discovery = EtcdDiscovery(settings)
        await discovery.start()
        try:
            return await discovery.list_workers()
        finally:
            await discovery.close()

    return {r.worker_id: r for r in asyncio.run(read())}


def wait_registered(
    etcd: EtcdServer, proc: LauncherProcess, worker_id: str, within: float = START_TIMEOUT
) -> WorkerRecord:
    """The record of ``worker_id`` once it is in etcd; fails at once if the launcher exits."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            record = etcd_workers(etcd).get(worker_id)
        except DiscoveryError:  # etcd did not answer this time (a starved machine): ask again
            record = None
        if record is not None:
            return record
        if proc.proc.poll() is not None:
            raise AssertionError(f"launcher exited ({proc.proc.returncode}):\n{proc.output()[-4000:]}")
        time.sleep(1.0)
    raise AssertionError(f"{worker_id} not registered after {within}s:\n{proc.output()[-4000:]}")


class KvSubscriber:
    """A real ZMQ SUB on a worker's advertised KV endpoint, decoding with the ``vllm`` decoder."""

    def __init__(self, endpoint: str, topic: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.connect(endpoint)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        decoder: KvEventDecoder = make_hooks().catalog().kv_decoders.get("vllm")
        self.decoder = decoder

    def stored(self, within: float) -> list[BlockStored]:
        """BlockStored events received within ``within`` seconds."""
        out: list[BlockStored] = []
        deadline = time.monotonic() + within
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000)):
                break
            frames = self.sock.recv_multipart()
            batch = self.decoder.decode(frames[-1])
            out += [e for e in batch.events if isinstance(e, BlockStored)]
        return out

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()

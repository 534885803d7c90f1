"""``infera-run workers``: the fleet as a table or JSON, from etcd or a static file."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from infera_core.discovery.base import DiscoverySettings
from infera_core.discovery.etcd import EtcdDiscovery
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import CliResult
from infera_core.util.net import free_port
from infera_core.worker import WorkerRecord


async def _register_and_leave(server: EtcdServer) -> None:
    """Register two workers and close without deregistering (their 10 s leases stay)."""
    disc = EtcdDiscovery(DiscoverySettings(etcd_endpoints=[server.endpoint], lease_ttl=10))
    await disc.start()
    for i, status in enumerate(("active", "draining")):
        record = {"worker_id": f"w{i}", "url": f"http://10.0.0.{i}:8000", "model": "qwen", "engine": "vllm"}
        await disc.register(WorkerRecord.model_validate({**record, "status": status}))
    await disc.close()


@pytest.mark.etcd
def test_lists_etcd_fleet_as_json_and_table(
    etcd_server: EtcdServer, infera_cli: Callable[..., CliResult]
) -> None:
    asyncio.run(_register_and_leave(etcd_server))
    out = infera_cli("workers", "--etcd-endpoint", etcd_server.url, "--json")
    assert out.code == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["worker_id"], r["status"], r["url"]) for r in rows] == [
        ("w0", "active", "http://10.0.0.0:8000"),
        ("w1", "draining", "http://10.0.0.1:8000"),
    ]
    table = infera_cli("workers", env={"INFERA_ETCD_ENDPOINT": etcd_server.endpoint})
    assert table.code == 0 and "w1" in table.stdout and "draining" in table.stdout


def test_lists_a_static_file_and_reports_errors(tmp_path: Path, infera_cli: Callable[..., CliResult]) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("- {url: 'http://10.0.0.9:8000', model: qwen}\n")
    out = infera_cli("workers", "--discovery", "static", "--static-file", str(path), "--json")
    assert out.code == 0, out.stderr
    assert [(r["worker_id"], r["engine"]) for r in json.loads(out.stdout)] == [("10.0.0.9:8000", "unknown")]
    path.write_text("- {model: qwen}\n")
    bad = infera_cli("workers", "--static-file", str(path))
    assert bad.code == 1 and bad.stderr.startswith("infera-run: error: --static-file")
    unreachable = infera_cli(
        "workers", "--etcd-endpoint", f"127.0.0.1:{free_port()}", "--discovery-timeout", "1"
    )
    assert unreachable.code == 1 and "cannot reach etcd" in unreachable.stderr
    assert "Traceback" not in bad.stderr + unreachable.stderr

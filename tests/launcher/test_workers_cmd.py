"""``infera-run workers``: the fleet as a table or JSON, from etcd or a static file."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from infera_core.discovery.base import DiscoverySettings
from infera_core.discovery.etcd import EtcdDiscovery
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.net import free_port
from infera_core.worker import WorkerRecord


def workers(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infera_core", "workers", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.etcd
async def test_lists_etcd_fleet_as_json_and_table(
    etcd_server: EtcdServer, standin_env: dict[str, str]
) -> None:
    disc = EtcdDiscovery(DiscoverySettings(etcd_endpoints=[etcd_server.endpoint]))
    await disc.start()
    for i, status in enumerate(("active", "draining")):
        await disc.register(
            WorkerRecord.model_validate(
                {
                    "worker_id": f"w{i}",
                    "url": f"http://10.0.0.{i}:8000",
                    "model": "qwen",
                    "engine": "vllm",
                    "status": status,
                }
            )
        )
    out = await asyncio.to_thread(workers, standin_env, "--etcd-endpoint", etcd_server.url, "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["worker_id"], r["status"], r["url"]) for r in rows] == [
        ("w0", "active", "http://10.0.0.0:8000"),
        ("w1", "draining", "http://10.0.0.1:8000"),
    ]
    table = await asyncio.to_thread(workers, {**standin_env, "INFERA_ETCD_ENDPOINT": etcd_server.endpoint})
    assert table.returncode == 0 and "w1" in table.stdout and "draining" in table.stdout
    await disc.close()


def test_lists_a_static_file_and_reports_errors(tmp_path: Path, standin_env: dict[str, str]) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("- {url: 'http://10.0.0.9:8000', model: qwen}\n")
    out = workers(standin_env, "--discovery", "static", "--static-file", str(path), "--json")
    assert out.returncode == 0, out.stderr
    assert [(r["worker_id"], r["engine"]) for r in json.loads(out.stdout)] == [("10.0.0.9:8000", "unknown")]
    path.write_text("- {model: qwen}\n")
    bad = workers(standin_env, "--static-file", str(path))
    assert bad.returncode == 1 and bad.stderr.startswith("infera-run: error: --static-file")
    unreachable = workers(
        standin_env, "--etcd-endpoint", f"127.0.0.1:{free_port()}", "--connect-timeout", "1"
    )
    assert unreachable.returncode == 1 and "cannot reach etcd" in unreachable.stderr
    assert "Traceback" not in bad.stderr + unreachable.stderr

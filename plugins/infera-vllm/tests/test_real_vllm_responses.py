"""The ``openai`` SDK's Responses API through ``infera-run up`` against two real vLLM workers on CPU:
plain, streamed, and chained with ``previous_response_id`` — each link answered by the worker that
stored the one before (vLLM keeps stored responses in its own process; the launcher turns its store
on). A few chains in the default run, 50 in the slow one."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from openai.types.responses import ResponseCreatedEvent
from real_vllm import ENGINE_ARGS, engine_env, running_up, vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def up_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``infera-run up`` with two real vLLM workers; its OpenAI base URL."""
    python, model = vllm_python()
    env = engine_env(tmp_path_factory.mktemp("vllm-cache"))
    env.pop("VLLM_ENABLE_RESPONSES_API_STORE", None)  # the launcher's default (on) is under test
    args = ["--engine", "vllm", "--workers", "2", "--model", "tiny", "--model-path", model]
    with running_up([*args, "--engine-python", python, "--", *ENGINE_ARGS], env) as (url, _):
        yield url


@pytest.fixture
def oai(up_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=up_url, api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def chain(client: openai.OpenAI, links: int, tag: str) -> None:
    """One conversation of ``links`` chained calls: each is answered by the first one's worker."""
    first = client.responses.with_raw_response.create(
        model="tiny", input=f"{tag} begins", max_output_tokens=2
    )
    worker = first.headers["x-infera-worker"]
    prev = first.parse().id
    for turn in range(links):
        nxt = client.responses.with_raw_response.create(
            model="tiny", input=f"{tag} turn {turn}", previous_response_id=prev, max_output_tokens=2
        )
        assert nxt.headers["x-infera-worker"] == worker, (tag, turn)
        answer = nxt.parse()
        assert answer.previous_response_id == prev
        prev = answer.id


def test_plain_streamed_and_chained_responses(oai: openai.OpenAI) -> None:
    made = oai.responses.create(model="tiny", input="hello", max_output_tokens=4)
    assert made.id and made.output_text is not None
    assert made.usage is not None and made.usage.output_tokens >= 1
    got = oai.responses.retrieve(made.id)  # GET /v1/responses/{id} on the worker holding it
    assert got.id == made.id and got.output_text == made.output_text
    with oai.responses.stream(model="tiny", input="stream this", max_output_tokens=4) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and final.output_text
    for n in range(3):  # a streamed answer's id (from its first event) is pinned too
        with oai.responses.with_streaming_response.create(
            model="tiny", input=f"streamed {n}", max_output_tokens=2, stream=True
        ) as streamed:
            worker = streamed.headers["x-infera-worker"]
            lines = list(streamed.iter_lines())  # whole: vLLM stores a stream's answer at its end
        created = next(line for line in lines if '"response.created"' in line)
        rid = ResponseCreatedEvent.model_validate_json(created.removeprefix("data: ")).response.id
        nxt = oai.responses.with_raw_response.create(
            model="tiny", input="and then", previous_response_id=rid, max_output_tokens=2
        )
        assert nxt.headers["x-infera-worker"] == worker
    for n in range(4):  # with 2 workers, a router ignoring the pin misses ~half the links
        chain(oai, 2, f"chain {n}")
    with pytest.raises(openai.NotFoundError) as err:
        oai.responses.create(model="tiny", input="x", previous_response_id="resp_nobody")
    assert "none of the 2 workers" in str(err.value)
    with pytest.raises(openai.APIStatusError) as unsupported:  # vLLM 0.32 serves no DELETE
        oai.responses.delete(made.id)
    assert unsupported.value.status_code == 501 and "does not serve DELETE" in str(unsupported.value)


@pytest.mark.slow
def test_fifty_chains_each_reach_the_storing_worker(oai: openai.OpenAI) -> None:
    for n in range(50):
        chain(oai, 1, f"chain {n}")

"""Request knobs (n, max_completion_tokens, ignore_eos, stop_token_ids) and client disconnects."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from infera_sim.metrics import parse_gauges
from infera_sim.testing import SimHandle, start_sim


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(
        speedup=1, itl_base_ms=20, eos_rate=0.2, kv_events_port=None, kv_replay_port=None
    ) as handle:
        yield handle


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=20) as c:
        yield c


def _post(client: httpx.Client, sim: SimHandle, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post(sim.url + path, json=body)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def test_eos_ends_early_unless_ignored(sim: SimHandle, client: httpx.Client) -> None:
    body = {"prompt": "tell me a story", "max_tokens": 30, "n": 4}
    natural = _post(client, sim, "/v1/completions", body)
    forced = _post(client, sim, "/v1/completions", dict(body, ignore_eos=True))
    assert {c["finish_reason"] for c in natural["choices"]} >= {"stop"}
    assert [c["finish_reason"] for c in forced["choices"]] == ["length"] * 4
    assert forced["usage"]["completion_tokens"] == 120 > natural["usage"]["completion_tokens"]


def test_max_completion_tokens_and_stream_with_n(sim: SimHandle, client: httpx.Client) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 3,
        "n": 2,
        "ignore_eos": True,
        "stream": True,
    }
    texts = {0: "", 1: ""}
    finishes: dict[int, str] = {}
    with client.stream("POST", sim.url + "/v1/chat/completions", json=body) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    texts[choice["index"]] += choice["delta"].get("content") or ""
                    if choice["finish_reason"]:
                        finishes[choice["index"]] = choice["finish_reason"]
    assert finishes == {0: "length", 1: "length"}
    assert texts[0] and texts[1] and texts[0] != texts[1]
    assert all(len(t.split()) == 3 for t in texts.values())


def test_stop_token_ids(sim: SimHandle, client: httpx.Client) -> None:
    tokens_out = _post(client, sim, "/tokenize", {"prompt": "x"})  # shape check on the way
    assert tokens_out["count"] == 2
    first = _post(client, sim, "/v1/completions", {"prompt": [1, 9, 9], "max_tokens": 6, "ignore_eos": True})
    text = first["choices"][0]["text"]
    third_word = text.split()[2]
    stop_id = _post(client, sim, "/tokenize", {"prompt": " " + third_word})["tokens"][1]
    cut = _post(
        client,
        sim,
        "/v1/completions",
        {"prompt": [1, 9, 9], "max_tokens": 6, "ignore_eos": True, "stop_token_ids": [stop_id]},
    )
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["usage"]["completion_tokens"] <= 3


def test_client_disconnect_frees_the_request(sim: SimHandle, client: httpx.Client) -> None:
    body = {"prompt": "a long answer please", "max_tokens": 500, "ignore_eos": True, "stream": True}
    with client.stream("POST", sim.url + "/v1/completions", json=body) as resp:
        lines = resp.iter_lines()
        next(line for line in lines if line.startswith("data: {"))
        running = parse_gauges(client.get(sim.url + "/metrics").text, ("vllm:num_requests_running",))
        assert running["vllm:num_requests_running"] == 1
    deadline = time.monotonic() + 5
    while True:
        metrics = parse_gauges(client.get(sim.url + "/metrics").text, ("vllm:num_requests_running",))
        if metrics["vllm:num_requests_running"] == 0:
            break
        assert time.monotonic() < deadline, "the aborted request is still running"
        time.sleep(0.05)
    assert client.get(sim.url + "/sim/cache").json()["used_blocks"] == 0

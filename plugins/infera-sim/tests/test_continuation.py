"""The sim continues an answer the way a greedy engine does (what migration relies on).

Its next token depends on the context only, so prompt + the first k generated tokens, sent
again, produce the rest of the same answer; chat requests take ``continue_final_message``
(the final message left open, as vLLM renders it) and ``return_token_ids`` streams the ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from infera_sim.testing import SimHandle, start_sim


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(model="m", speedup="inf", kv_events_port=None, kv_replay_port=None) as s:
        yield s


def events(sim: SimHandle, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", sim.url + path, json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    return [json.loads(x) for x in lines if x != "[DONE]"]


def test_prompt_plus_generated_ids_continues_the_same_answer(sim: SimHandle) -> None:
    body = {
        "model": "m",
        "prompt": "once upon a time",
        "max_tokens": 30,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    whole = events(sim, "/v1/completions", body)
    prompt = whole[0]["choices"][0]["prompt_token_ids"]
    ids = [t for e in whole for c in e["choices"] for t in c["token_ids"]]
    pieces = [c["text"] for e in whole for c in e["choices"]]  # one token per chunk
    rest = events(sim, "/v1/completions", {**body, "prompt": prompt + ids[:10], "max_tokens": 20})
    assert "".join(c["text"] for e in rest for c in e["choices"]) == "".join(pieces[10:])


def test_a_chat_continues_its_final_message(sim: SimHandle) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 20,
        "ignore_eos": True,
    }
    whole = "".join(
        c["delta"].get("content") or ""
        for e in events(sim, "/v1/chat/completions", body)
        for c in e["choices"]
    )
    head = " ".join(whole.split(" ")[:6])  # the first five generated words (each one token)
    assert head.strip()
    cont = {
        **body,
        "messages": [*body["messages"], {"role": "assistant", "content": head}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "max_tokens": 15,
    }
    rest = "".join(
        c["delta"].get("content") or ""
        for e in events(sim, "/v1/chat/completions", cont)
        for c in e["choices"]
    )
    assert head + rest == whole


def test_continue_final_message_with_a_generation_prompt_is_refused_like_vllm(sim: SimHandle) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "continue_final_message": True}
    r = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and "continue_final_message" in r.json()["error"]["message"]

"""The pure half of migration: reading what was relayed, building the continuation, rewriting it."""

from __future__ import annotations

import json

from infera_core.server.migrate import (
    Resumed,
    asking_ids,
    continuation_body,
    read_relayed,
    strip_ids,
    whole_events,
)


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


ROLE = sse(
    {
        "id": "c1",
        "created": 7,
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
        "prompt_token_ids": [1, 2, 3],
    }
)


def piece(text: str, tok: int) -> bytes:
    return sse(
        {
            "id": "c1",
            "created": 7,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None, "token_ids": [tok]}],
        }
    )


def test_only_whole_events_go_out_and_the_rest_waits() -> None:
    out, rest = whole_events(b"", b'data: {"a":1}\n\ndata: {"b"')
    assert out == b'data: {"a":1}\n\n' and rest == b'data: {"b"'
    out, rest = whole_events(rest, b":2}\n\n")
    assert out == b'data: {"b":2}\n\n' and rest == b""
    assert whole_events(b"", b"data: {") == (b"", b"data: {")


def test_the_relayed_ids_and_text_are_read_back() -> None:
    r = read_relayed(ROLE + piece(" ka", 11) + piece("lo", 12), chat=True)
    assert (r.id, r.created, "".join(r.text), r.token_ids, r.prompt_token_ids) == (
        "c1",
        7,
        " kalo",
        [11, 12],
        [1, 2, 3],
    )
    assert r.role_sent and r.generated == 2 and r.finish is None


def test_a_chat_with_ids_continues_as_a_token_prompt() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 10,
        "stream": True,
    }
    r = read_relayed(ROLE + piece(" ka", 11), chat=True)
    out = continuation_body(body, r, chat=True)
    assert isinstance(out, dict)
    assert out["prompt"] == [1, 2, 3, 11] and out["max_tokens"] == 9 and "messages" not in out


def test_a_chat_without_ids_continues_its_final_message() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    r = read_relayed(
        ROLE.replace(b',"prompt_token_ids":[1,2,3]', b"") + sse({"choices": [{"delta": {"content": " ka"}}]}),
        True,
    )
    out = continuation_body(body, r, chat=True)
    assert isinstance(out, dict)
    assert out["messages"][-1] == {"role": "assistant", "content": " ka"}
    assert (
        out["continue_final_message"] is True
        and out["add_generation_prompt"] is False
        and out["max_tokens"] == 9
    )


def test_nothing_left_to_generate_is_no_continuation() -> None:
    r = read_relayed(ROLE + piece(" ka", 11), chat=True)
    assert isinstance(continuation_body({"messages": [], "max_tokens": 1}, r, chat=True), str)


def test_the_continuation_is_rewritten_into_the_first_stream() -> None:
    r = read_relayed(ROLE + piece(" ka", 11), chat=True)
    resumed = Resumed(r, chat=True, as_chat=True)
    completion = sse(
        {
            "id": "x9",
            "created": 99,
            "object": "text_completion",
            "choices": [
                {
                    "index": 0,
                    "text": "lo",
                    "finish_reason": "length",
                    "prompt_token_ids": [1],
                    "token_ids": [12],
                }
            ],
        }
    )
    usage = sse(
        {
            "id": "x9",
            "created": 99,
            "choices": [],
            "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5},
        }
    )
    out = resumed.feed(completion[:10]) + resumed.feed(completion[10:] + usage + b"data: [DONE]\n\n")
    events = [json.loads(e[6:]) for e in out.split(b"\n\n") if e.startswith(b"data: {")]
    assert [(e["id"], e["created"]) for e in events] == [("c1", 7), ("c1", 7)]
    assert events[0]["object"] == "chat.completion.chunk" and events[0]["choices"][0]["delta"] == {
        "content": "lo"
    }
    assert events[1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert out.endswith(b"data: [DONE]\n\n")


def test_ids_the_router_asked_for_never_reach_the_client() -> None:
    raw, body = asking_ids(b'{"model":"m","stream":true}', {"model": "m", "stream": True})
    assert json.loads(raw)["return_token_ids"] is True and body["return_token_ids"] is True
    stripped = strip_ids(ROLE + piece(" ka", 11))
    assert b"token_ids" not in stripped
    assert [json.loads(e[6:])["choices"][0]["delta"] for e in stripped.split(b"\n\n") if e] == [
        {"role": "assistant", "content": ""},
        {"content": " ka"},
    ]


def _lp(token_id: int, raw: bytes) -> dict[str, object]:
    """llama.cpp's ``n_probs: 1`` output for one sampled token."""
    return {
        "content": [
            {"id": token_id, "token": raw.decode(errors="replace"), "bytes": list(raw), "logprob": -1.0}
        ]
    }


def _llama_chunk(text: str, probs: dict[str, object] | None) -> bytes:
    choice: dict[str, object] = {"finish_reason": None, "index": 0, "delta": {"content": text}}
    if probs is not None:
        choice["logprobs"] = probs
    return sse({"choices": [choice], "created": 7, "id": "c1", "object": "chat.completion.chunk"})


def test_llama_cpp_ids_come_from_its_probabilities_and_never_reach_the_client() -> None:
    raw, body = asking_ids(b'{"model":"m","stream":true}', {"model": "m", "stream": True}, probs=True)
    assert json.loads(raw)["n_probs"] == 1 and body["n_probs"] == 1
    chunks = _llama_chunk("a", _lp(97, b"a")) + _llama_chunk(" b]}", _lp(300, b" b]}"))
    r = read_relayed(chunks, chat=True)
    assert r.token_ids == [97, 300] and not r.ids_lost and "".join(r.text) == "a b]}"
    out = strip_ids(chunks)
    assert b"logprobs" not in out
    assert [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in out.split(b"\n\n") if e] == [
        "a",
        " b]}",
    ]
    # a completion chunk gets llama.cpp's unasked ``"logprobs":null`` back
    done = sse(
        {"choices": [{"text": "x", "index": 0, "logprobs": _lp(1, b"x")}], "object": "text_completion"}
    )
    assert json.loads(strip_ids(done)[6:])["choices"][0]["logprobs"] is None


def test_a_token_llama_cpp_held_back_makes_the_ids_incomplete() -> None:
    # the first token is half a UTF-8 character: llama.cpp sends it with the next one, with only that one's id
    chunks = _llama_chunk("a", _lp(97, b"a")) + _llama_chunk("\ufffdd", _lp(100, b"d"))
    r = read_relayed(chunks, chat=True)
    assert r.token_ids is None and r.ids_lost


def test_a_mixed_prompt_carries_the_rendered_chat_and_the_ids() -> None:
    r = read_relayed(_llama_chunk("a", _lp(97, b"a")), chat=True)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}
    got = continuation_body(body, r, chat=True, prompt_text="<user>hi</user>")
    assert isinstance(got, dict) and got["prompt"] == ["<user>hi</user>", 97] and got["max_tokens"] == 4
    assert "messages" not in got
    done = continuation_body({"model": "m", "prompt": "hi", "max_tokens": 5}, r, chat=False, mixed=True)
    assert isinstance(done, dict) and done["prompt"] == ["hi", 97]


def test_a_replay_skips_what_the_client_has() -> None:
    r = read_relayed(ROLE + _llama_chunk("hel", None) + _llama_chunk("l", None), chat=True)
    resumed = Resumed(r, chat=True, replay=True)
    role = sse({"id": "c2", "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]})
    out = resumed.feed(
        role + _llama_chunk("he", None) + _llama_chunk("llo", None) + _llama_chunk(" world", None)
    )
    events = [json.loads(e[6:]) for e in out.split(b"\n\n") if e]
    assert [e["choices"][0]["delta"]["content"] for e in events] == ["o", " world"]
    assert {e["id"] for e in events} == {"c1"}
    usage = sse({"id": "c2", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 12}})
    assert json.loads(resumed.feed(usage)[6:])["usage"] == {"prompt_tokens": 9, "completion_tokens": 12}

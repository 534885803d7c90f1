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

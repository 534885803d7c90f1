"""A lone UTF-16 surrogate in a message (issue #28 row 16): accepted, and forwarded as valid
JSON with U+FFFD in its place (what an engine's strict parser and tokenizer accept)."""

from __future__ import annotations

import json

import msgspec

from infera_core.testing.server import serving_one_scripted
from infera_core.testing.upstream import http_reply

ANSWER = b'{"id":"x","object":"chat.completion","choices":[]}'
REPLY = http_reply(200, ANSWER)


def _chat(content_json: str) -> bytes:
    return b'{"model":"fake-model","messages":[{"role":"user","content":"%s"}]}' % content_json.encode()


async def test_lone_surrogates_are_forwarded_as_replacement_characters() -> None:
    async with serving_one_scripted(REPLY) as (engine, _, c):
        headers = {"content-type": "application/json"}
        sent = {
            r"a\ud800b": "a\ufffdb",  # lone high
            r"\udc00\ud800": "\ufffd\ufffd",  # lone low, then lone high
            r"\ud800\ud83d\ude00": "\ufffd\U0001f600",  # a lone one before a pair
        }
        for escaped, expected in sent.items():
            r = await c.post("/v1/chat/completions", content=_chat(escaped), headers=headers)
            assert r.status_code == 200, r.text
            forwarded = msgspec.json.decode(engine.bodies[-1])  # strict: valid Unicode JSON
            assert forwarded["messages"][0]["content"] == expected
        # a pair and an escaped backslash are forwarded byte for byte
        for escaped in (r"\ud83d\ude00", r"\\ud800"):
            body = _chat(escaped)
            r = await c.post("/v1/chat/completions", content=body, headers=headers)
            assert r.status_code == 200 and engine.bodies[-1] == body
        # a body that is broken otherwise still gets the JSON error
        r = await c.post("/v1/chat/completions", content=_chat(r"\ud800")[:-3], headers=headers)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        assert json.loads(r.text)["error"]["message"].startswith("The request body is not valid JSON")


async def test_tokenize_forwards_them_the_same_way() -> None:
    tokens = http_reply(200, b'{"tokens":[1,2,3],"count":3,"max_model_len":2048}')
    async with serving_one_scripted(tokens) as (engine, _, c):
        body = b'{"model":"fake-model","prompt":"a\\ud800b"}'
        r = await c.post("/tokenize", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        assert msgspec.json.decode(engine.bodies[-1])["prompt"] == "a\ufffdb"

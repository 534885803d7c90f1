"""Fuzz routing tokenization's bounds (issue #28, rows 1–2) over prompt shapes and sizes.

Hypothesis draws completions (one string, a batch of strings) and chats (one long
message, many messages, content parts, long system prompts) from a few characters to
several times the cut, for the real ``hf`` (tiny BPE, chat template) and ``sim``
tokenizers. Whatever was drawn: the tokenizer is handed at most ``max_chars`` characters
(a chat: rendered from at most that much text), the ids are at most ``max_tokens`` and a
prefix of the whole prompt's, the token-id cache never holds more than its bytes nor a
prompt longer than the cut, and the conversation-prefix cache stays within its budget.
Batches of distinct large prompts leave behind (tracemalloc) no more than those caches.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infera_core.plugin.hooks import InferaHooks
from infera_core.request import RequestContext
from infera_core.testing.attack import big_prompt
from infera_core.testing.fuzz import fuzz_settings
from infera_core.testing.tiny_tokenizer import make_tiny_model_dir
from infera_core.tokenize.prompt import prompt_size
from infera_core.tokenize.service import RoutingTokenizers
from infera_core.tokenize.specs import parse_model_specs

MAX_CHARS = 2000
MAX_TOKENS = 400
CACHE_BYTES = 48 * 1024
PREFIX_BYTES = 256 * 1024
FUZZ = fuzz_settings(60)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))


class Spy:
    """Wraps a tokenizer; records the characters of every text (or rendered chat) it gets."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.fingerprint = tok.fingerprint
        self.seen: list[int] = []

    def encode(self, text: str) -> list[int]:
        self.seen.append(len(text))
        return list(self.tok.encode(text))

    def encode_chat(self, messages: list[Any], body: dict[str, Any]) -> list[int]:
        self.seen.append(prompt_size({"messages": messages}))
        return list(self.tok.encode_chat(messages, body))


class PrefixSpy(Spy):
    def render_chat(self, messages: list[Any], body: dict[str, Any]) -> str:
        self.seen.append(prompt_size({"messages": messages}))
        return str(self.tok.render_chat(messages, body))

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        self.seen.append(len(text))
        ids, starts = self.tok.encode_offsets(text)
        return list(ids), list(starts)


def service(tiny_dir: Path, spec: str) -> tuple[RoutingTokenizers, Spy]:
    where = f":{tiny_dir}" if spec == "hf" else ""
    tokens = RoutingTokenizers(
        InferaHooks.load().catalog().tokenizers,
        parse_model_specs([f"tiny={spec}{where}"]),
        max_chars=MAX_CHARS,
        max_tokens=MAX_TOKENS,
        cache_bytes=CACHE_BYTES,
        prefix_cache_bytes=PREFIX_BYTES,
        offload_chars=500,
        prefix_wait_ms=0,
    )
    tok = tokens.tokenizer_for("tiny")
    assert tok is not None
    spy = (PrefixSpy if hasattr(tok, "render_chat") else Spy)(tok)
    tokens._models["tiny"].tokenizer = spy  # type: ignore[assignment]
    return tokens, spy


sizes = st.one_of(st.integers(0, 300), st.integers(300, MAX_CHARS), st.integers(MAX_CHARS, 40 * MAX_CHARS))
texts = st.tuples(sizes, st.integers(0, 10**6)).map(lambda t: big_prompt(t[0], t[1]))
parts = st.lists(texts, min_size=1, max_size=4).map(lambda ts: [{"type": "text", "text": t} for t in ts])
contents = texts | parts


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    if draw(st.booleans()):
        prompt = draw(texts | st.lists(texts, min_size=1, max_size=3))
        return "/v1/completions", {"prompt": prompt}
    turns = draw(st.lists(contents, min_size=1, max_size=6))
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(texts)})
    for i, content in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": content})
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "go on"})
    return "/v1/chat/completions", {"messages": messages}


@pytest.mark.parametrize("spec", ["hf", "sim"])
def test_any_prompt_is_tokenized_within_the_bounds(tiny_dir: Path, spec: str) -> None:
    tokens, spy = service(tiny_dir, spec)
    tried = {"cut": 0, "whole": 0}

    @given(req=requests())
    @FUZZ
    def check(req: tuple[str, dict[str, Any]]) -> None:
        route, body = req
        spy.seen.clear()
        ctx = RequestContext("r", "tiny", route, {"model": "tiny", **body})
        asyncio.run(tokens.fill(ctx))
        assert not ctx.tokenize_failed, body
        assert all(n <= MAX_CHARS for n in spy.seen), spy.seen  # never more text than the cut
        ids = ctx.token_ids or []
        assert len(ids) <= MAX_TOKENS
        assert tokens.cache_held <= CACHE_BYTES
        assert tokens.prefixes.bytes <= PREFIX_BYTES
        size = prompt_size(ctx.body)
        tried["cut" if size > MAX_CHARS else "whole"] += 1
        if size > MAX_CHARS:  # a cut prompt is never cached: its key is not even computed
            assert all(len(k) == 2 for k in tokens._cache)
        if size <= 4 * MAX_CHARS:  # the ids are a prefix of the whole prompt's (checked when cheap)
            whole = _whole(spy.tok, route, ctx.body)
            assert ids == whole[: len(ids)]

    check()
    print(f"{spec}: {tried['cut']} prompts over the cut, {tried['whole']} under it")
    assert tried["cut"] and tried["whole"]


def _whole(tok: Any, route: str, body: dict[str, Any]) -> list[int]:
    if route == "/v1/completions":
        prompt = body["prompt"]
        return list(tok.encode(prompt if isinstance(prompt, str) else prompt[0]))
    return list(tok.encode_chat(body["messages"], body))


@pytest.mark.parametrize("spec", ["hf", "sim"])
def test_many_distinct_large_prompts_leave_only_the_bounded_caches(tiny_dir: Path, spec: str) -> None:
    """Row 2 as a property: whatever sizes and shapes of distinct large prompts come, what the
    tokenizer service keeps afterwards (Python memory, tracemalloc) is at most its two caches'
    budgets: no prompt, rendered text or id list outlives its request."""
    import gc
    import tracemalloc

    tokens, _ = service(tiny_dir, spec)
    asyncio.run(tokens.fill(RequestContext("warm", "tiny", "/v1/completions", {"prompt": "warm up"})))
    seen: list[int] = []

    @given(
        prompts=st.lists(st.tuples(st.integers(50_000, 1_000_000), st.booleans()), min_size=4, max_size=12),
        seed=st.integers(0, 10**9),
    )
    @settings(max_examples=8, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def check(prompts: list[tuple[int, bool]], seed: int) -> None:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i, (size, as_chat) in enumerate(prompts):
            text = big_prompt(size, seed + i)
            body: dict[str, Any] = (
                {"messages": [{"role": "user", "content": text}]} if as_chat else {"prompt": text}
            )
            route = "/v1/chat/completions" if as_chat else "/v1/completions"
            ctx = RequestContext("r", "tiny", route, {"model": "tiny", **body})
            asyncio.run(tokens.fill(ctx))
            assert ctx.token_ids and len(ctx.token_ids) <= MAX_TOKENS
            del text, body, ctx
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        seen.append(kept)
        assert kept < CACHE_BYTES + PREFIX_BYTES + (2 << 20), kept  # the caches' budgets, 2 MB slack
        assert tokens.cache_held <= CACHE_BYTES and tokens.prefixes.bytes <= PREFIX_BYTES

    check()
    print(f"{spec}: kept at most {max(seen) >> 10} KiB after batches of distinct 50 KB-1 MB prompts")

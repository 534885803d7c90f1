"""Incremental chat tokenization agrees with full tokenization on the block hashes routing uses.

Every request of the multi-turn workload and of a Mooncake-trace-shaped conversation
workload goes through the routing tokenizer service (which reuses the previous
turn's token ids) and is compared with a full tokenization of the same request.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.traces import MOONCAKE_TRACE
from infera_core.bench.workloads import WordSource, multi_turn_workload
from infera_core.kv.index import KvIndex
from infera_core.plugin.hooks import InferaHooks
from infera_core.request import RequestContext
from infera_core.testing.tiny_tokenizer import make_tiny_model_dir
from infera_core.tokenize.hf import HfTokenizer
from infera_core.tokenize.incremental import PrefixTokenCache, common_prefix_len
from infera_core.tokenize.service import RoutingTokenizers
from infera_core.tokenize.specs import parse_model_specs

TRACE = MOONCAKE_TRACE
BLOCK_SIZES = (16, 32)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))


def _service(tiny_dir: Path) -> RoutingTokenizers:
    return RoutingTokenizers(
        InferaHooks.load().catalog().tokenizers,
        parse_model_specs([f"tiny=hf:{tiny_dir}"]),
        cache_size=0,
        prefix_wait_ms=0,  # always the whole prompt (routing on a known prefix: its own test)
    )


async def _check_all(tokens: RoutingTokenizers, requests: list[list[dict[str, Any]]]) -> None:
    tok = tokens.tokenizer_for("tiny")
    assert isinstance(tok, HfTokenizer)
    for i, messages in enumerate(requests):
        ctx = RequestContext(f"r{i}", "tiny", "/v1/chat/completions", {"messages": messages})
        await tokens.fill(ctx)
        full = tok.encode_chat(messages, {})
        assert ctx.token_ids is not None
        for bs in BLOCK_SIZES:
            assert KvIndex.hash_prompt(ctx.token_ids, bs) == KvIndex.hash_prompt(full, bs), (i, bs)
        assert ctx.token_ids == full, i


def _multi_turn_requests() -> list[list[dict[str, Any]]]:
    sessions = multi_turn_workload(
        sessions=6, turns=6, first_len=600, turn_len=80, output_len=60, system_len=40
    )
    replies = WordSource(7)
    histories: list[list[dict[str, Any]]] = [
        [{"role": "system", "content": str(s.extra["system"])}] if s.extra.get("system") else []
        for s in sessions
    ]
    out = []
    for t in range(6):  # interleaved: turn t of every session, then turn t + 1
        for s, msgs in zip(sessions, histories, strict=True):
            msgs.append({"role": "user", "content": str(s.turns[t].prompt)})
            out.append(list(msgs))
            msgs.append({"role": "assistant", "content": replies.text(s.turns[t].max_tokens)})
    return out


def _mooncake_requests(n: int, words_per_block: int = 24) -> tuple[list[list[dict[str, Any]]], int]:
    """One message per trace block (text fixed per hash id), roles alternating: later requests
    that share a hash-id prefix extend an earlier conversation, as in the trace."""
    rows = [json.loads(line) for line in TRACE.read_text().splitlines()]
    roots: dict[int, int] = {}
    for row in rows:
        roots[row["hash_ids"][0]] = roots.get(row["hash_ids"][0], 0) + 1
    rows = [row for row in rows if roots[row["hash_ids"][0]] > 1][:n]  # the conversations, in trace order
    blocks: dict[int, str] = {}
    src = WordSource(3)
    out = []
    seen: set[tuple[int, ...]] = set()
    extending = 0  # requests sharing at least 10 blocks (> one 1024-char chunk) with an earlier one
    for row in rows:
        ids = tuple(row["hash_ids"])
        extending += len(ids) >= 10 and ids[:10] in seen
        seen.update(ids[:k] for k in range(1, len(ids) + 1))
        msgs = []
        for k, h in enumerate(row["hash_ids"]):
            if h not in blocks:
                blocks[h] = src.text(words_per_block) + ("." if h % 3 else "\n\n")
            msgs.append({"role": "user" if k % 2 == 0 else "assistant", "content": blocks[h]})
        out.append(msgs)
    return out, extending


async def test_multi_turn_workload_agrees_with_full_tokenization(tiny_dir: Path) -> None:
    tokens = _service(tiny_dir)
    requests = _multi_turn_requests()
    await _check_all(tokens, requests)
    p = tokens.prefixes
    assert p.fallbacks == 0 and p.misses == 6 and p.hits == len(requests) - 6
    assert p.reused_tokens > 3 * p.new_tokens  # later turns: only the new messages are tokenized
    samples = {(m.name, tuple(smp.labels.values())): smp.value for m in tokens.collect() for smp in m.samples}
    assert samples[("infera_routing_tokenize_prefix", ("hit",))] == p.hits
    assert samples[("infera_routing_tokenize_prefix_tokens", ("reused",))] == p.reused_tokens
    assert samples[("infera_routing_tokenize_prefix_cache_bytes", ())] == p.bytes > 0


async def test_mooncake_shaped_conversations_agree_with_full_tokenization(tiny_dir: Path) -> None:
    tokens = _service(tiny_dir)
    requests, extending = _mooncake_requests(500)
    await _check_all(tokens, requests)
    p = tokens.prefixes
    assert p.hits >= extending > 100 and p.fallbacks == 0, (p.hits, extending)


def test_cache_is_bounded_by_bytes_and_drops_superseded_turns(tiny_dir: Path) -> None:
    tok = HfTokenizer(tiny_dir)
    cache = PrefixTokenCache(max_bytes=200_000, chunk_chars=256)
    src = WordSource(1)
    text = src.text(300)
    for _ in range(5):  # one conversation: each turn replaces the one before
        text += " " + src.text(50)
        assert cache.encode("m", text, tok.encode_offsets) == tok.encode_offsets(text)[0]
    assert len(cache) == 1 and cache.hits == 4
    for _ in range(40):  # many conversations: the oldest are evicted
        other = src.text(400)
        cache.encode("m", other, tok.encode_offsets)
        assert cache.bytes <= cache.max_bytes
    assert len(cache) < 40
    assert cache.encode("other-model", text, tok.encode_offsets) == tok.encode_offsets(text)[0]


def test_common_prefix_len() -> None:
    assert common_prefix_len("abcdef", "abcxef") == 3
    assert common_prefix_len("abc", "abcdef") == 3
    assert common_prefix_len("", "x") == 0 and common_prefix_len("x", "y") == 0


_pieces = st.sampled_from(
    [
        "the",
        " a",
        " of",
        "ka",
        "lo",
        "mi",
        " ",
        "  ",
        "\n",
        "\n\n",
        ".",
        "<s>",
        "</s>",
        "é",
        "日本",
        "🙂",
        "'s",
        "\t",
        "12",
    ]
)


@settings(max_examples=150, deadline=None)
@given(prefix=st.lists(_pieces, min_size=0, max_size=400), suffix=st.lists(_pieces, max_size=60))
def test_any_extension_tokenizes_like_the_whole_text(
    tiny_dir: Path, prefix: list[str], suffix: list[str]
) -> None:
    tok = HfTokenizer(tiny_dir)
    cache = PrefixTokenCache(chunk_chars=16, margin=4)
    first = "".join(prefix)
    second = first + "".join(suffix)
    assert cache.encode("m", first, tok.encode_offsets) == tok.encode_offsets(first)[0]
    assert cache.encode("m", second, tok.encode_offsets) == tok.encode_offsets(second)[0]
    edited = second[: len(second) // 2] + "ka" + second[len(second) // 2 :]  # diverges inside the prefix
    assert cache.encode("m", edited, tok.encode_offsets) == tok.encode_offsets(edited)[0]


async def test_the_event_loop_keeps_running_while_a_long_prompt_is_tokenized(tiny_dir: Path) -> None:
    tokens = _service(tiny_dir)
    ticks = 0
    running = True

    async def ticker() -> None:
        nonlocal ticks
        while running:
            await asyncio.sleep(0.001)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    ticks = 0
    ctx = RequestContext("r", "tiny", "/v1/completions", {"prompt": WordSource(2).text(12000)})
    await tokens.fill(ctx)  # ~40k tokens: tens of ms in a thread that does not hold the GIL
    seen = ticks
    running = False
    await task
    assert ctx.token_ids and len(ctx.token_ids) > 30000
    assert seen >= 5  # with the GIL held (Tokenizer.encode) the loop got 0-2 ticks


class _GatedTokenizer(HfTokenizer):
    """The real tokenizer, whose encoding waits (bounded) while ``gate`` is closed."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.gate.set()

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        self.gate.wait(10)
        return super().encode_offsets(text)


async def test_a_turn_routes_on_the_known_prefix_while_its_suffix_is_tokenized(tiny_dir: Path) -> None:
    tokens = RoutingTokenizers(
        InferaHooks.load().catalog().tokenizers,
        parse_model_specs([f"tiny=hf:{tiny_dir}"]),
        prefix_wait_ms=200,
    )
    tok = _GatedTokenizer(tiny_dir)
    assert tokens.tokenizer_for("tiny") is not None
    tokens._models["tiny"].tokenizer = tok
    words = WordSource(5)
    messages = [{"role": "user", "content": words.text(2000)}]
    await tokens.fill(RequestContext("r1", "tiny", "/v1/chat/completions", {"messages": list(messages)}))
    messages += [
        {"role": "assistant", "content": words.text(100)},
        {"role": "user", "content": words.text(50)},
    ]
    tok.gate.clear()  # the suffix "takes long"
    ctx = RequestContext("r2", "tiny", "/v1/chat/completions", {"messages": list(messages)})
    await tokens.fill(ctx)
    full = tok.encode_chat(messages, {})
    tok.gate.set()
    assert ctx.token_ids is not None and 0 < len(ctx.token_ids) < len(full)
    assert full[: len(ctx.token_ids)] == ctx.token_ids  # routed on the known prefix's blocks
    assert tokens.counts[("tiny", "prefix")] == 1
    for _ in range(500):  # the suffix finishes in the background and serves the next turn
        if tokens.prefixes.hits == 1 and len(tokens.prefixes) == 1:
            break
        await asyncio.sleep(0.01)
    messages.append({"role": "assistant", "content": words.text(80)})
    last = RequestContext("r3", "tiny", "/v1/chat/completions", {"messages": list(messages)})
    await tokens.fill(last)
    assert last.token_ids == tok.encode_chat(messages, {}) and tokens.prefixes.hits == 2

"""What routing tokenizes of a long prompt, and what its token-id cache keeps (issue #28, rows 1–2).

The text is cut before it is tokenized (a chat: after its template is rendered), so the
work and memory of one request are bounded whatever its size; the ids are then a prefix
of the whole prompt's ids (prefix routing needs no more). The cache is bounded in bytes
and keeps no prompt longer than the cut.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infera_core.plugin.hooks import InferaHooks
from infera_core.request import RequestContext
from infera_core.testing.attack import big_prompt
from infera_core.testing.tiny_tokenizer import make_tiny_model_dir
from infera_core.tokenize.hf import HfTokenizer
from infera_core.tokenize.prompt import completion_prompt, ids_bytes
from infera_core.tokenize.service import CUT_MARGIN, RoutingTokenizers
from infera_core.tokenize.specs import parse_model_specs


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))


def service(tiny_dir: Path, spec: str = "hf", **kw: Any) -> RoutingTokenizers:
    where = f":{tiny_dir}" if spec == "hf" else ""
    return RoutingTokenizers(
        InferaHooks.load().catalog().tokenizers, parse_model_specs([f"tiny={spec}{where}"]), **kw
    )


def ctx(body: dict[str, Any], route: str = "/v1/completions") -> RequestContext:
    return RequestContext("r1", "tiny", route, body)


class Lengths:
    """Wraps a tokenizer, recording the length of every text it is given."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.seen: list[int] = []
        self.fingerprint = tok.fingerprint

    def encode(self, text: str) -> list[int]:
        self.seen.append(len(text))
        return list(self.tok.encode(text))

    def encode_chat(self, messages: list[dict[str, Any]], body: dict[str, Any]) -> list[int]:
        self.seen.append(sum(len(m["content"]) for m in messages))
        return list(self.tok.encode_chat(messages, body))


@pytest.mark.parametrize("spec", ["hf", "sim"])
async def test_a_long_prompt_is_cut_before_tokenizing_and_its_ids_are_the_prompts_prefix(
    tiny_dir: Path, spec: str
) -> None:
    tokens = service(tiny_dir, spec, max_chars=5000, max_tokens=0, offload_chars=100)
    tok = tokens.tokenizer_for("tiny")
    assert tok is not None
    spy = tokens._models["tiny"].tokenizer = Lengths(tok)  # type: ignore[assignment]
    prompt = big_prompt(200_000)
    c = ctx({"prompt": prompt})
    await tokens.fill(c)
    assert spy.seen == [5000]  # 200,000 characters in, 5,000 tokenized
    full = tok.encode(prompt)
    assert c.token_ids == full[: len(c.token_ids or [])]  # a prefix of the whole prompt's ids
    assert len(c.token_ids or []) == len(tok.encode(prompt[:5000])) - CUT_MARGIN
    assert tokens.cut == {"tiny": 1}
    chat = ctx({"messages": [{"role": "user", "content": prompt}]}, "/v1/chat/completions")
    await tokens.fill(chat)
    whole = tok.encode_chat([{"role": "user", "content": prompt}], {})
    assert chat.token_ids and chat.token_ids == whole[: len(chat.token_ids)]
    assert len(chat.token_ids) > 500 and max(spy.seen) <= 5000


class Rendered(Lengths):
    """A prefix tokenizer (renders its template) recording the length of each text it encodes."""

    def render_chat(self, messages: list[dict[str, Any]], body: dict[str, Any]) -> str:
        return str(self.tok.render_chat(messages, body))

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        self.seen.append(len(text))
        ids, starts = self.tok.encode_offsets(text)
        return list(ids), list(starts)


async def test_hf_chat_is_rendered_then_cut(tiny_dir: Path) -> None:
    tokens = service(tiny_dir, max_chars=3000, max_tokens=0, offload_chars=100)
    tok = tokens.tokenizer_for("tiny")
    assert isinstance(tok, HfTokenizer)
    spy = tokens._models["tiny"].tokenizer = Rendered(tok)  # type: ignore[assignment]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": big_prompt(50_000)}]
    c = ctx({"messages": messages}, "/v1/chat/completions")
    await tokens.fill(c)
    assert spy.seen == [3000]
    whole = tok.encode_chat(messages, {})
    assert c.token_ids and c.token_ids == whole[: len(c.token_ids)] and c.token_ids[0] == 1


async def test_routing_max_tokens_bounds_the_ids_and_the_cut(tiny_dir: Path) -> None:
    tokens = service(tiny_dir, max_tokens=100, offload_chars=10**9)
    assert tokens.max_chars == 800  # 8 characters a token, under --tokenize-max-chars
    c = ctx({"prompt": big_prompt(10_000)})
    await tokens.fill(c)
    assert c.token_ids is not None and len(c.token_ids) == 100


async def test_the_token_id_cache_is_bounded_in_bytes_and_skips_big_prompts(tiny_dir: Path) -> None:
    budget = 64 * 1024
    tokens = service(tiny_dir, "sim", cache_bytes=budget, max_chars=20_000, max_tokens=0, offload_chars=10**9)
    for i in range(60):
        await tokens.fill(ctx({"prompt": big_prompt(400, seed=i)}))
        assert tokens.cache_held <= budget
    assert 0 < len(tokens._cache) < 60  # the oldest went: bytes, not the 4096 entries, bound it
    assert tokens.cache_held == sum(cost for _, cost in tokens._cache.values())
    held = tokens.cache_held
    big = ctx({"prompt": big_prompt(15_000, seed=99)})  # ids over an eighth of the budget
    await tokens.fill(big)
    assert big.token_ids and ids_bytes(big.token_ids) > budget // 8
    assert tokens.cache_held == held  # not cached
    cut = ctx({"prompt": big_prompt(30_000, seed=98)})  # longer than the cut: never cached
    await tokens.fill(cut)
    again = ctx({"prompt": big_prompt(30_000, seed=98)})
    await tokens.fill(again)
    assert tokens.counts.get(("tiny", "cache"), 0) == 0 and again.token_ids == cut.token_ids
    small = ctx({"prompt": "the a of"})
    await tokens.fill(small)
    await tokens.fill(ctx({"prompt": "the a of"}))
    assert tokens.counts[("tiny", "cache")] == 1


def test_serve_and_up_take_the_bounds_as_flags_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from infera_core.server.settings import ServeSettings
    from infera_core.testing.fixtures import make_hooks
    from infera_core.up.settings import UpSettings
    from infera_core.up.stack import Stack

    monkeypatch.setenv("INFERA_TOKENIZE_CACHE_MB", "8")
    assert ServeSettings().tokenize_cache_mb == 8.0
    settings = UpSettings(workers=0, tokenize_max_chars=1000, routing_max_tokens=50)
    served = Stack(settings, make_hooks())._serve_settings()
    assert (served.tokenize_cache_mb, served.tokenize_max_chars, served.routing_max_tokens) == (8.0, 1000, 50)


class RenderSizes(Rendered):
    """:class:`Rendered` that also records the characters of the messages it renders."""

    def __init__(self, tok: Any) -> None:
        super().__init__(tok)
        self.rendered: list[int] = []

    def render_chat(self, messages: list[dict[str, Any]], body: dict[str, Any]) -> str:
        self.rendered.append(sum(len(t) for t in _texts(messages)))
        return super().render_chat(messages, body)


def _texts(messages: list[dict[str, Any]]) -> list[str]:
    out = []
    for m in messages:
        c = m.get("content")
        out += [c] if isinstance(c, str) else [p["text"] for p in c or [] if "text" in p]
    return out


async def test_only_what_can_be_tokenized_of_a_huge_chat_is_rendered(tiny_dir: Path) -> None:
    """A 4 MB chat costs the template what a 3,000-character one does (the template used to
    render all of it, holding the interpreter, before the text was cut), and its ids are
    still the prefix of the whole chat's."""
    tokens = service(tiny_dir, max_chars=3000, max_tokens=0, offload_chars=100)
    tok = tokens.tokenizer_for("tiny")
    assert isinstance(tok, HfTokenizer)
    spy = tokens._models["tiny"].tokenizer = RenderSizes(tok)  # type: ignore[assignment]
    parts = [{"type": "text", "text": big_prompt(1000, 1)}, {"type": "text", "text": big_prompt(2 << 20, 2)}]
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": parts},
        {"role": "assistant", "content": big_prompt(2 << 20, 3)},
        {"role": "user", "content": "and then?"},
    ]
    c = ctx({"messages": messages}, "/v1/chat/completions")
    await tokens.fill(c)
    assert spy.rendered == [3000] and spy.seen == [3000]  # was 4 MB rendered, then cut
    whole = tok.encode_chat(messages, {})
    assert c.token_ids and c.token_ids == whole[: len(c.token_ids)]
    assert len(c.token_ids) >= len(tok.encode_chat(messages[:1], {})) and tokens.cut == {"tiny": 1}


def test_offsets_of_a_long_text_are_the_encodings_offsets(tiny_dir: Path) -> None:
    """Past 8,192 tokens the offsets are read one token at a time (no long hold of the
    interpreter): the same starts as ``Encoding.offsets`` gives, special tokens included."""
    tok = HfTokenizer(tiny_dir)
    text = tok.render_chat([{"role": "user", "content": big_prompt(40_000)}], {}) + " é😀 x"
    ids, starts = tok.encode_offsets(text)
    enc = tok._encode(text, False)
    assert len(ids) > 8192
    assert ids == list(enc.ids) and starts == [s for s, _ in enc.offsets]


@pytest.mark.parametrize(
    ("prompt", "text"), [("hi", "hi"), (["first", "second"], "first"), ([], ""), (None, None), ([1, 2], None)]
)
def test_the_routing_and_engine_tokenizers_read_the_same_completion_prompt(
    prompt: Any, text: str | None
) -> None:
    """Both tokenize the first prompt of a list; a body with no text prompt is refused alike."""
    body = {"model": "m"} if prompt is None else {"model": "m", "prompt": prompt}
    if text is None:
        with pytest.raises(ValueError, match="no prompt or messages to tokenize"):
            completion_prompt(body)
    else:
        assert completion_prompt(body) == text

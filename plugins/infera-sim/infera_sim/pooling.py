"""The sim's pooling routes (``--task embed|classify|score``), answered as vLLM 0.32 answers them.

vLLM mounts routes by the model's tasks (``vllm/entrypoints/pooling/factories.py``): an
embedding model serves ``/v1/embeddings`` and, through cosine similarity, ``/score`` and
``/rerank``; a classifier ``/classify``; a cross-encoder (one label) ``/classify``, ``/score``
and ``/rerank``; a pooling model none of the generate routes. The sim does the same, with
deterministic vectors: a text's embedding is the normalized sum of one seeded pseudo-random
vector per token, so texts sharing words score higher than texts that do not.
"""

from __future__ import annotations

import base64
import math
import random
import struct
import time
import uuid
from collections.abc import Awaitable, Callable
from functools import lru_cache
from typing import Any

from aiohttp import web

from infera_sim.openai_api import ApiError
from infera_sim.tokenizer import EngineTokenizer

EMBED_DIM = 64
"""Length of the sim's embeddings."""

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
SCORE_ROUTES = ("/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank")


@lru_cache(maxsize=65536)
def _token_vector(token: int, seed: int) -> tuple[float, ...]:
    rng = random.Random(token * 1_000_003 + seed)
    return tuple(rng.gauss(0.0, 1.0) for _ in range(EMBED_DIM))


def embed_tokens(tokens: list[int], seed: int = 0, dims: int = EMBED_DIM) -> list[float]:
    """The normalized sum of the tokens' vectors, cut to ``dims`` (Matryoshka-style)."""
    acc = [0.0] * EMBED_DIM
    for t in tokens:
        for i, x in enumerate(_token_vector(t, seed)):
            acc[i] += x
    acc = acc[:dims]
    norm = math.sqrt(sum(x * x for x in acc)) or 1.0
    return [x / norm for x in acc]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _usage(n: int) -> dict[str, Any]:
    return {
        "prompt_tokens": n,
        "total_tokens": n,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


async def openapi(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the routes this sim serves, as FastAPI lists vLLM's (``paths``), so
    a launcher learns the model's tasks from it as from vLLM."""
    paths: dict[str, dict[str, Any]] = {}
    for route in request.app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if path and route.method in ("GET", "POST"):
            paths.setdefault(path, {})[route.method.lower()] = {}
    return web.json_response({"openapi": "3.1.0", "info": {"title": "infera-sim"}, "paths": paths})


def listed(prefix: str, model: str, data: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    """vLLM's list answer (embeddings, scores, classifications): id, object, created, model,
    data, usage."""
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": _usage(tokens),
    }


class Pooling:
    """The pooling handlers of one sim (``task``: its ``--task``)."""

    def __init__(
        self, task: str, model: str, tokenizer: EngineTokenizer, max_model_len: int, seed: int
    ) -> None:
        self.task = task
        self.model = model
        self.tok = tokenizer
        self.max_len = max_model_len
        self.seed = seed

    def routes(self) -> dict[str, Handler]:
        """Path → handler, the routes vLLM mounts for this task."""
        out: dict[str, Handler] = {}
        if self.task == "embed":
            out["/v1/embeddings"] = self.embeddings
        if self.task in ("classify", "score"):
            out["/classify"] = self.classify
        if self.task in ("embed", "score"):
            for path in SCORE_ROUTES:
                out[path] = self.rerank if "rerank" in path else self.score
        return out

    # -- inputs --------------------------------------------------------------------------
    def _tokens(self, text: Any, param: str) -> list[int]:
        if isinstance(text, str):
            ids = self.tok.encode(text)
        elif isinstance(text, dict) and isinstance(text.get("content"), str):
            ids = self.tok.encode(text["content"])
        elif isinstance(text, list) and text and all(type(t) is int for t in text):
            ids = list(text)
        else:
            raise ApiError(f"{param}: expected a string or token ids, got {type(text).__name__}", param)
        if len(ids) > self.max_len:
            raise ApiError(
                f"This model's maximum context length is {self.max_len} tokens. However, you requested"
                f" {len(ids)} tokens in the input. Please reduce the length of the input.",
                param,
            )
        return ids

    def _inputs(self, body: dict[str, Any]) -> list[list[int]]:
        """``input`` (a text, texts, token ids or lists of them) or ``messages``, tokenized."""
        if "input" not in body and isinstance(body.get("messages"), list) and body["messages"]:
            return [self.tok.encode_chat(body["messages"], body)]
        value = body.get("input")
        if isinstance(value, str) or (isinstance(value, list) and value and type(value[0]) is int):
            return [self._tokens(value, "input")]
        if isinstance(value, list) and value:
            return [self._tokens(v, "input") for v in value]
        raise ApiError("input must be a non-empty string, list of strings or token ids", "input")

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.model:
            raise ApiError(f"The model `{model}` does not exist.", "model", 404)

    def _pairs(self, first: Any, second: Any) -> list[tuple[list[int], list[int]]]:
        """vLLM's pairing: one query against every document, or N queries against N documents."""
        q = first if isinstance(first, list) and first and type(first[0]) is not int else [first]
        d = second if isinstance(second, list) and second and type(second[0]) is not int else [second]
        if len(q) == 1:
            q = q * len(d)
        if len(q) != len(d):
            raise ApiError("Input lengths must be either 1:1, 1:N or N:N", "data_1")
        return [(self._tokens(a, "queries"), self._tokens(b, "documents")) for a, b in zip(q, d, strict=True)]

    def _score(self, query: list[int], doc: list[int]) -> float:
        cos = cosine(embed_tokens(query, self.seed), embed_tokens(doc, self.seed))
        if self.task == "embed":  # vLLM scores an embedding model by cosine similarity
            return cos
        return 1.0 / (1.0 + math.exp(-4.0 * cos))  # a cross-encoder's sigmoid

    # -- handlers ------------------------------------------------------------------------
    async def embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check_model(body)
        inputs = self._inputs(body)
        dims = body.get("dimensions")
        if dims is not None and (type(dims) is not int or not 1 <= dims <= EMBED_DIM):
            raise ApiError(f"dimensions must be between 1 and {EMBED_DIM}", "dimensions")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise ApiError(
                f"encoding_format {fmt!r} is not supported: use float or base64", "encoding_format"
            )
        data = []
        for i, ids in enumerate(inputs):
            vec = embed_tokens(ids, self.seed, dims or EMBED_DIM)
            emb: Any = (
                vec if fmt == "float" else base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
            )
            data.append({"index": i, "object": "embedding", "embedding": emb})
        return listed("embd", self.model, data, sum(len(ids) for ids in inputs))

    async def score(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check_model(body)
        for first, second in (("queries", "documents"), ("queries", "items"), ("text_1", "text_2")):
            if first in body and second in body:
                pairs = self._pairs(body[first], body[second])
                break
        else:
            if "data_1" not in body or "data_2" not in body:
                raise ApiError("Field required: queries and documents (or data_1 and data_2)", "queries")
            pairs = self._pairs(body["data_1"], body["data_2"])
        data = [{"index": i, "object": "score", "score": self._score(q, d)} for i, (q, d) in enumerate(pairs)]
        return listed("score", self.model, data, sum(len(q) + len(d) for q, d in pairs))

    async def rerank(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check_model(body)
        query, documents = body.get("query"), body.get("documents")
        if query is None or documents is None:
            raise ApiError("Field required: query and documents", "query" if query is None else "documents")
        docs = documents if isinstance(documents, list) else [documents]
        top_n = body.get("top_n") or 0
        pairs = self._pairs(query, docs)
        results: list[dict[str, Any]] = []
        for i, (q, d) in enumerate(pairs):
            doc = docs[i]
            shown = (
                {"text": doc, "multi_modal": None}
                if isinstance(doc, str)
                else {"text": None, "multi_modal": doc.get("content", []) if isinstance(doc, dict) else []}
            )
            results.append({"index": i, "document": shown, "relevance_score": self._score(q, d)})
        results.sort(key=lambda r: r["relevance_score"], reverse=True)
        if 0 < top_n < len(docs):
            results = results[:top_n]
        n = sum(len(q) + len(d) for q, d in pairs)
        return {
            "id": f"score-{uuid.uuid4().hex}",
            "model": self.model,
            "usage": {"prompt_tokens": n, "total_tokens": n},
            "results": results,
        }

    async def classify(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check_model(body)
        inputs = self._inputs(body)
        labels = 1 if self.task == "score" else 2
        data = []
        for i, ids in enumerate(inputs):
            vec = embed_tokens(ids, self.seed)
            if labels == 1:
                probs = [1.0 / (1.0 + math.exp(-4.0 * vec[0]))]
            else:
                logits = [4.0 * vec[0], 4.0 * vec[1]]
                top = max(logits)
                exps = [math.exp(x - top) for x in logits]
                probs = [x / sum(exps) for x in exps]
            best = max(range(labels), key=lambda k: probs[k])
            data.append({"index": i, "label": f"LABEL_{best}", "probs": probs, "num_classes": labels})
        return listed("classify", self.model, data, sum(len(ids) for ids in inputs))

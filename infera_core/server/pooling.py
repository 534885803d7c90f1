"""The pooling routes: embeddings, scores, rerank and classification, in vLLM's shapes.

``POST /v1/embeddings`` (OpenAI), ``/score`` and ``/v1/score``, ``/rerank``, ``/v1/rerank``
and ``/v2/rerank`` (Jina/Cohere), ``/classify`` — the routes vLLM 0.32 serves for a pooling
model (``vllm/entrypoints/pooling/*/api_router.py``). Each goes to a worker whose record says
it serves the route's task (``WorkerRecord.tasks``: ``embed``, ``score``, ``classify``), the
least busy one (router in-flight count; ties taken in turn): a pooling request has no prefix
worth a cache-aware choice. The body goes to the worker unchanged and its answer comes back
unchanged; a worker that fails before answering (connection, 5xx) is skipped for the next.

A model none of whose workers serve the task (a chat model asked for embeddings) is a 400 in
the OpenAI shape naming what it does serve; an unknown model a 404; a body without the
route's inputs a 400 naming the missing field. Metrics, the access log and traces count
these requests as they count chat (prompt tokens from the engine's ``usage``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from infera_core.scheduling.types import Endpoint
from infera_core.server.core import RouterCore
from infera_core.server.errors import ApiError, bad_request
from infera_core.server.observed import Observed, answer_observed
from infera_core.server.tokenize_routes import forward, model_named, read_request
from infera_core.server.validate import BodyLimits

Check = Callable[[dict[str, Any]], None]

WHAT = {"embed": "embeddings", "score": "scores or rerank", "classify": "classification"}
"""A task in words, for errors."""


def _is_tokens(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def _inputs(body: dict[str, Any], name: str) -> bool:
    """``body[name]`` is a string, strings, token ids or lists of token ids (OpenAI's ``input``)."""
    value = body.get(name)
    if isinstance(value, str):
        return True
    if not isinstance(value, list) or not value:
        return False
    return all(isinstance(v, str) for v in value) or _is_tokens(value) or all(_is_tokens(v) for v in value)


def _messages(body: dict[str, Any]) -> bool:
    messages = body.get("messages")
    return isinstance(messages, list) and bool(messages)


def check_embeddings(body: dict[str, Any]) -> None:
    if _inputs(body, "input") or ("input" not in body and _messages(body)):
        return
    raise bad_request(
        "'input' must be a string, an array of strings, or an array of token ids (or of arrays of"
        " them), non-empty (or pass 'messages' for a chat embedding).",
        "input",
        "invalid_type" if "input" in body else "missing_required_parameter",
    )


def check_classify(body: dict[str, Any]) -> None:
    if _inputs(body, "input") or ("input" not in body and _messages(body)):
        return
    raise bad_request(
        "'input' must be a string, an array of strings, or token ids (or pass 'messages').",
        "input",
        "invalid_type" if "input" in body else "missing_required_parameter",
    )


def _score_input(value: Any) -> bool:
    """A text, a content object, or a non-empty array of them (vLLM's ``ScoreInput``)."""
    if isinstance(value, str | dict):
        return True
    return isinstance(value, list) and bool(value) and all(isinstance(v, str | dict) for v in value)


_SCORE_PAIRS = (("queries", "documents"), ("queries", "items"), ("text_1", "text_2"), ("data_1", "data_2"))


def check_score(body: dict[str, Any]) -> None:
    for first, second in _SCORE_PAIRS:
        if first in body and second in body:
            for name in (first, second):
                if not _score_input(body[name]):
                    raise bad_request(
                        f"'{name}' must be a string, an object, or a non-empty array of them.",
                        name,
                        "invalid_type",
                    )
            return
    raise bad_request(
        "Pass the texts to score as 'queries' and 'documents' (or 'text_1' and 'text_2',"
        " 'data_1' and 'data_2', 'queries' and 'items').",
        "queries",
        "missing_required_parameter",
    )


def check_rerank(body: dict[str, Any]) -> None:
    query = body.get("query")
    if not isinstance(query, str | dict):
        code = "invalid_type" if "query" in body else "missing_required_parameter"
        raise bad_request("'query' must be a string (or a content object).", "query", code)
    if not _score_input(body.get("documents")):
        code = "invalid_type" if "documents" in body else "missing_required_parameter"
        raise bad_request("'documents' must be a non-empty array of strings (or objects).", "documents", code)
    top_n = body.get("top_n")
    if top_n is not None and (type(top_n) is not int or top_n < 0):
        raise bad_request("'top_n' must be a non-negative integer.", "top_n", "invalid_type")


POOLING_ROUTES: dict[str, tuple[str, Check]] = {
    "/v1/embeddings": ("embed", check_embeddings),
    "/score": ("score", check_score),
    "/v1/score": ("score", check_score),
    "/rerank": ("score", check_rerank),
    "/v1/rerank": ("score", check_rerank),
    "/v2/rerank": ("score", check_rerank),
    "/classify": ("classify", check_classify),
}
"""Route → (the task a worker must serve, the body's check)."""


class PoolingRoutes:
    """Picks the worker of each pooling request (least busy; ties in turn)."""

    def __init__(self, core: RouterCore) -> None:
        self.core = core
        self._turn = itertools.count()

    def model_of(self, body: dict[str, Any], task: str) -> str:
        """``model``, or the one model serving ``task`` when the body names none (as vLLM)."""
        table = self.core.table
        serving = [m for m in table.models() if table.serving(m, task)] if "model" not in body else []
        return model_named(body, serving, f"models serving {WHAT[task]}")

    def workers(self, model: str, task: str) -> list[Endpoint]:
        """The active workers of ``model`` that serve ``task``, least busy first."""
        table = self.core.table
        if model not in table.every:
            shown = ", ".join(table.models())
            raise ApiError(
                404,
                f"The model {model!r} does not exist on this server. Available models: {shown}",
                param="model",
                code="model_not_found",
            )
        eps = table.serving(model, task)
        if not eps:
            serves = ", ".join(table.tasks_of(model))
            raise bad_request(
                f"The model {model!r} does not serve {WHAT[task]}: its workers serve {serves}.",
                "model",
                "model_not_supported",
            )
        live = [ep for ep in eps if ep.record.routable and not ep.breaker_open]
        if not live:
            raise ApiError(503, f"No worker of model {model!r} is available.", code="no_worker_available")
        turn = next(self._turn) % len(live)
        return sorted(live[turn:] + live[:turn], key=lambda ep: ep.in_flight)


def add_pooling_routes(app: FastAPI, core: RouterCore, limits: BodyLimits) -> None:
    """Mount the pooling routes (:data:`POOLING_ROUTES`) on ``app``."""
    routes = PoolingRoutes(core)

    async def handle(request: Request) -> Response:
        path = request.url.path
        task, check = POOLING_ROUTES[path]

        async def run(obs: Observed) -> Response:
            auth, principal, raw, via, body = await read_request(request, core, limits)
            obs.ctx.principal = principal
            name = routes.model_of(body, task)
            check(body)
            workers = routes.workers(name, task)
            obs.model = obs.ctx.model = name
            if auth is not None and principal is not None:
                await auth.admit_waiting(principal, name)
            resp = await forward(core, name, path, raw, via, obs, workers)
            rec = obs.ctx.access
            if resp.status_code < 400 and rec is not None and rec.prompt:
                core.metrics.usage(name, rec.prompt, 0)
                if auth is not None and principal is not None:
                    auth.spent(principal, name, rec.prompt, 0)
            return resp

        return await answer_observed(request, path, core.request_id(), core.metrics, run)

    for path in POOLING_ROUTES:
        app.add_api_route(path, handle, methods=["POST"], include_in_schema=False)

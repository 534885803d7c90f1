"""``POST /tokenize`` and ``POST /detokenize`` in vLLM's shape, answered by a worker of the model.

Benchmark clients (``vllm bench serve``) tokenize and detokenize prompts with the
server they measure, so prompt lengths match the server's tokenizer. The router has
no tokenizer of its own for every model, so it forwards the body unchanged to one
worker serving the model (the least busy active one whose breaker is closed) and
answers with the worker's response:

* ``/tokenize``: ``{"model", "prompt", "add_special_tokens"}`` or ``{"model",
  "messages", "add_generation_prompt", …}`` → ``{"count", "max_model_len", "tokens",
  "token_strs"}``;
* ``/detokenize``: ``{"model", "tokens"}`` → ``{"prompt"}``.

``model`` may be left out when the server serves one model (as vLLM allows). A worker
that fails or has no such route (404/405: an engine without it) is skipped for the
next one; none left is a 502, or a 501 when none of them has the route.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from fastapi import FastAPI, Request
from fastapi.responses import Response

from infera_core.scheduling.types import Endpoint
from infera_core.server.asgi import read_body
from infera_core.server.auth import CLIENT_STATE, ClientAuth
from infera_core.server.core import RouterCore, usage_of
from infera_core.server.errors import ApiError, bad_request
from infera_core.server.keys import Principal
from infera_core.server.loops import LOOP_HEADER, LOOP_STATUS, came_back, stamped, via_of, via_value
from infera_core.server.observed import Observed, answer_observed
from infera_core.server.surrogates import LoneSurrogates
from infera_core.server.validate import BodyLimits, parse_body
from infera_core.transports.upstreams import READ_ERRORS, UpstreamError
from infera_core.util.redact import redact_url

_FAILURES: tuple[type[BaseException], ...] = (UpstreamError, *READ_ERRORS)


def model_named(body: dict[str, Any], served: list[str], which: str = "this server serves") -> str:
    """The body's ``model``; left out, the one model in ``served`` (as vLLM takes its only
    model), else a 400 listing them (``which``: what the list is)."""
    model = body.get("model")
    if model is None:
        if len(served) == 1:
            return served[0]
        shown = ", ".join(served) or "none"
        raise bad_request(
            f"Missing required parameter: 'model' ({which}: {shown}).", "model", "missing_required_parameter"
        )
    if not isinstance(model, str) or not model:
        raise bad_request("'model' must be a non-empty string.", "model", "invalid_type")
    return model


def check_tokenize(body: dict[str, Any]) -> None:
    prompt, messages = body.get("prompt"), body.get("messages")
    if isinstance(prompt, str) or (isinstance(messages, list) and messages):
        return
    raise bad_request(
        "Pass 'prompt' (a string) or 'messages' (a non-empty array).", "prompt", "missing_required_parameter"
    )


def check_detokenize(body: dict[str, Any]) -> None:
    tokens = body.get("tokens")
    if isinstance(tokens, list) and all(type(t) is int and 0 <= t < 2**63 for t in tokens):
        return
    raise bad_request("'tokens' must be an array of non-negative integers.", "tokens", "invalid_type")


def workers_for(core: RouterCore, model: str) -> list[Endpoint]:
    """Active workers of ``model`` with a closed breaker, least busy first."""
    eps = [ep for ep in core.table.every.get(model) or () if ep.record.routable and not ep.breaker_open]
    if not eps:
        if model not in core.table.every:
            shown = ", ".join(core.table.models())
            raise ApiError(
                404,
                f"The model {model!r} does not exist on this server. Available models: {shown}",
                param="model",
                code="model_not_found",
            )
        raise ApiError(503, f"No worker of model {model!r} is available.", code="no_worker_available")
    return sorted(eps, key=lambda ep: ep.in_flight)


async def forward(
    core: RouterCore,
    model: str,
    path: str,
    raw: bytes,
    via: bytes | None = None,
    obs: Observed | None = None,
    workers: list[Endpoint] | None = None,
) -> Response:
    """``raw`` to the first worker of ``model`` (``workers``: these, least busy first) that
    answers ``path``; its answer (``via``: the request's own ``Via``, kept in front of this
    router's stamp; ``obs``: the request's access record and trace)."""
    headers = {
        "Content-Type": "application/json",
        "X-Request-Id": obs.ctx.request_id if obs is not None else core.request_id(),
        "Via": via_value(via, core.router_id),
    }
    missing: list[str] = []
    failed: list[str] = []
    t0 = time.perf_counter()
    eps = workers if workers is not None else workers_for(core, model)
    for attempt, ep in enumerate(eps[: 1 + core.max_retries]):
        sent = headers
        if obs is not None:
            if attempt:
                obs.retried()
            sent = {**headers, **obs.upstream_headers(ep.worker_id, attempt)}
        ep.in_flight += 1  # the load the least-busy choice (and the scheduler) sees
        try:
            resp = await ep.upstream.open(ep, path, raw, sent)
            try:
                data = await resp.read()
            finally:
                resp.release()
        except _FAILURES as exc:
            failed.append(f"{ep.worker_id}: {exc}")
            if obs is not None:
                obs.failed()
            continue
        finally:
            ep.in_flight -= 1
        # 404/405 without a word about the model: the engine has no such route (the model
        # is known to be served, so vLLM's "model does not exist" 404 is passed on as is)
        if resp.status in (404, 405) and b"model" not in data[:400]:
            missing.append(f"{ep.worker_id} ({ep.record.engine})")
        elif resp.status == LOOP_STATUS and resp.header(LOOP_HEADER) == core.router_id:
            url = redact_url(ep.record.url)
            core.breakers.isolate(ep, f"its URL {url} leads back to this router (a routing loop)")
            failed.append(f"{ep.worker_id} is this router itself (a routing loop)")
        elif resp.status >= 500:
            failed.append(f"{ep.worker_id} answered {resp.status}")
        else:
            if obs is not None:
                prompt, completion = usage_of(data) if resp.status < 400 else (0, 0)
                obs.answered(ep.worker_id, time.perf_counter() - t0, prompt, completion)
            ctype = resp.content_type or "application/json"
            return Response(data, resp.status, {"x-infera-worker": ep.worker_id}, media_type=ctype)
        if obs is not None:
            obs.failed()
    if missing and not failed:
        raise ApiError(
            501,
            f"The workers of model {model!r} do not serve {path}: {', '.join(missing)}.",
            code="not_implemented",
        )
    raise ApiError(502, f"No worker answered {path}: {'; '.join(failed + missing)}.", code="upstream_error")


class ControlRequest(NamedTuple):
    """A read JSON request of a control route: who sent it, its bytes, its ``Via``, its body."""

    auth: ClientAuth | None
    principal: Principal | None
    raw: bytes
    via: bytes | None
    body: dict[str, Any]


async def read_request(request: Request, core: RouterCore, limits: BodyLimits) -> ControlRequest:
    """Authenticate, read and parse a JSON request as the hot routes do (lone surrogates
    replaced, a request that came back to this router refused)."""
    auth: ClientAuth | None = getattr(request.app.state, CLIENT_STATE, None)
    principal = auth.authenticate(request.scope) if auth is not None else None
    raw = await read_body(request.scope, request.receive, limits.max_bytes)
    via = via_of(request.scope["headers"])
    if stamped(via, core.router_id_bytes):
        raise came_back(core.router_id)
    try:
        body = await parse_body(raw, limits)
    except LoneSurrogates as lone:  # forwarded with U+FFFD in their place, as on /v1/*
        raw = lone.repaired
        body = await parse_body(raw, limits)
    return ControlRequest(auth, principal, raw, via, body)


def add_tokenize_routes(app: FastAPI, core: RouterCore, limits: BodyLimits) -> None:
    """Mount ``POST /tokenize`` and ``POST /detokenize`` on ``app``."""
    checks = {"/tokenize": check_tokenize, "/detokenize": check_detokenize}

    async def handle(request: Request) -> Response:
        path = request.url.path

        async def run(obs: Observed) -> Response:
            auth, principal, raw, via, body = await read_request(request, core, limits)
            obs.ctx.principal = principal
            name = model_named(body, core.table.models())
            checks[path](body)
            if name in core.table.every:  # never a metric label per unknown name
                obs.model = name
            if auth is not None and principal is not None:
                await auth.admit_waiting(principal, name)
            return await forward(core, name, path, raw, via, obs)

        return await answer_observed(request, path, core.request_id(), core.metrics, run)

    for path in checks:
        app.add_api_route(path, handle, methods=["POST"], include_in_schema=False)

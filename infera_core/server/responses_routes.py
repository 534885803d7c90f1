"""The stored-response routes of the Responses API, each sent to the worker that holds the response.

``GET /v1/responses/{id}`` (``?stream=true&starting_after=N`` streams a background response),
``DELETE /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items`` and
``POST /v1/responses/{id}/cancel`` go to the worker that served the response (noted by
:class:`~infera_core.server.response_owners.ResponseOwners`); an id this router process does
not know is looked for on the workers (each answers ``GET /v1/responses/{id}``: only the holder
finds it). A response whose worker is gone, or that no worker holds, is a 404 in OpenAI's
shape — never another worker's answer. A route the worker's engine does not serve (vLLM 0.32
has no ``DELETE`` and no ``input_items``) is a 501 naming the worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from infera_core.scheduling.types import Endpoint
from infera_core.server.auth import client_principal
from infera_core.server.errors import ApiError
from infera_core.server.fleet import EndpointTable
from infera_core.server.not_found import engine_error
from infera_core.server.response_owners import ResponseOwners

PROBE_TIMEOUT = 10.0
"""Seconds each worker has to say whether it holds an unknown response id."""


def not_found(response_id: str, why: str, param: str = "response_id") -> ApiError:
    return ApiError(404, f"Response with id {response_id!r} not found: {why}.", param=param, code="not_found")


class ResponseLocator:
    """Finds the worker holding a stored response: the noted one, else the one that says so."""

    def __init__(self, table: EndpointTable, owners: ResponseOwners, timeout: float = PROBE_TIMEOUT) -> None:
        self.table = table
        self.owners = owners
        self.timeout = timeout
        self.client: httpx.AsyncClient | None = None

    def http(self) -> httpx.AsyncClient:
        if self.client is None:
            self.client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout, read=None))
        return self.client

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None

    async def locate(self, response_id: str, model: str | None, param: str = "response_id") -> Endpoint:
        """The endpoint holding ``response_id`` (``model``: the request's, when it names one);
        a 404 :class:`ApiError` when its worker is gone or no worker holds it."""
        noted = self.owners.owner(response_id)
        if noted is not None:
            worker, _ = noted
            ep = self.table.by_id.get(worker)
            if ep is None:
                raise not_found(response_id, f"the worker that stored it ({worker}) is gone", param)
            return ep
        eps = self.table.candidates(model) if model else list(self.table.by_id.values())
        eps = [ep for ep in eps if ep.url.startswith(("http://", "https://"))]
        found = await asyncio.gather(*(self._holds(ep, response_id) for ep in eps))
        for ep, held in zip(eps, found, strict=True):
            if held:
                self.owners.note(response_id, ep.worker_id, ep.record.model)
                return ep
        scope = f"model {model!r}" if model else "this server"
        raise not_found(response_id, f"none of the {len(eps)} workers of {scope} holds it", param)

    async def _holds(self, ep: Endpoint, response_id: str) -> bool:
        try:
            r = await self.http().get(_url(ep, response_id), timeout=self.timeout)
        except httpx.HTTPError:
            return False
        return r.status_code == 200


def _url(ep: Endpoint, response_id: str, tail: str = "") -> str:
    return f"{ep.url.rstrip('/')}/v1/responses/{response_id}{tail}"


async def _forward(
    locator: ResponseLocator, request: Request, method: str, response_id: str, tail: str = ""
) -> Response:
    ep = await locator.locate(response_id, None)
    client = locator.http()
    sent = client.build_request(
        method, _url(ep, response_id, tail), params=request.query_params, content=await request.body()
    )
    try:
        upstream = await client.send(sent, stream=True)
    except httpx.HTTPError as exc:
        raise ApiError(
            502, f"Worker {ep.worker_id} failed before responding: {exc!r}", code="upstream_unreachable"
        ) from None
    worker = [("x-infera-worker", ep.worker_id)]
    ctype = upstream.headers.get("content-type", "application/json")
    if ctype.startswith("text/event-stream"):

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()

        return StreamingResponse(
            relay(), status_code=upstream.status_code, media_type=ctype, headers=dict(worker)
        )
    try:
        data = await upstream.aread()
    finally:
        await upstream.aclose()
    status = upstream.status_code
    if status in (404, 405) and engine_error(data) is None:  # the engine has no such route
        engine = ep.record.engine or "its engine"
        raise ApiError(
            501,
            f"Worker {ep.worker_id} ({engine}) does not serve {method} /v1/responses/{{id}}{tail}.",
            code="unsupported_by_engine",
        )
    if status == 200 and method == "DELETE":
        locator.owners.forget(response_id)
    return Response(data, status_code=status, media_type=ctype, headers=dict(worker))


def add_responses_routes(app: FastAPI, locator: ResponseLocator) -> None:
    """Retrieve, delete, input items and cancel of stored responses."""
    auth = [Depends(client_principal)]

    @app.get("/v1/responses/{response_id}", dependencies=auth)
    async def retrieve(response_id: str, request: Request) -> Response:
        return await _forward(locator, request, "GET", response_id)

    @app.delete("/v1/responses/{response_id}", dependencies=auth)
    async def delete(response_id: str, request: Request) -> Response:
        return await _forward(locator, request, "DELETE", response_id)

    @app.get("/v1/responses/{response_id}/input_items", dependencies=auth)
    async def input_items(response_id: str, request: Request) -> Response:
        return await _forward(locator, request, "GET", response_id, "/input_items")

    @app.post("/v1/responses/{response_id}/cancel", dependencies=auth)
    async def cancel(response_id: str, request: Request) -> Response:
        return await _forward(locator, request, "POST", response_id, "/cancel")

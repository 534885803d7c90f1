"""Sending one PD leg: the prefill leg read in full, the decode leg opened for relaying.

A failure on the worker's side (unreachable, timeout, 5xx, 429, a reply the protocol
cannot use) raises :class:`LegFailed` after counting it (``infera_pd_failures_total``) and
feeding the worker's circuit breaker, exactly as a mixed worker's failure would. A 4xx
from a leg is the client's fault: an :class:`ApiError` carrying the worker's message.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from infera_core.engines.pd import LegRequest
from infera_core.scheduling.types import Endpoint
from infera_core.server.breaker import Breakers
from infera_core.server.errors import ApiError
from infera_core.server.hangs import HangDetector
from infera_core.server.loops import LOOP_HEADER, LOOP_STATUS, loop_error, via_value
from infera_core.server.metrics import ServerMetrics
from infera_core.server.pd.metrics import PdMetrics
from infera_core.transports.upstreams import (
    READ_ERRORS,
    RequestTooLargeError,
    Upstream,
    UpstreamError,
    UpstreamResponse,
)
from infera_core.util.redact import redact_url

log = logging.getLogger("infera.server.pd")

_READ_ERRORS = READ_ERRORS


class LegFailed(Exception):
    """A leg failed on the worker's side; ``side`` is ``prefill`` or ``decode``."""

    def __init__(self, side: str, endpoint: Endpoint, reason: str, error: ApiError) -> None:
        super().__init__(error.message)
        self.side = side
        self.endpoint = endpoint
        self.reason = reason
        self.error = error


def _client_error(status: int, data: bytes, worker: str) -> ApiError:
    """The worker's own 4xx, re-raised with its message (the body was the client's)."""
    message = data[:300].decode("utf-8", "replace")
    param = code = None
    try:
        err = json.loads(data).get("error")
        if isinstance(err, dict):
            message = str(err.get("message") or message)
            param, code = err.get("param"), err.get("code")
    except (ValueError, AttributeError):
        pass
    return ApiError(status, message, param=param, code=code, headers={"X-Infera-Worker": worker})


class Legs:
    """Sends legs through each endpoint's upstream client, with the server's breakers and metrics."""

    def __init__(
        self,
        upstream: Upstream,
        breakers: Breakers,
        metrics: ServerMetrics,
        pd: PdMetrics,
        hangs: HangDetector | None = None,
    ) -> None:
        self.upstream = upstream
        self.breakers = breakers
        self.metrics = metrics
        self.pd = pd
        self.hangs = hangs
        """First-byte outlier detection: a leg's worker that never answers leaves rotation."""
        self.router_id = ""
        """This router's ``Via`` stamp on every leg (:mod:`infera_core.server.loops`); empty: none."""

    def fail(
        self, side: str, ep: Endpoint, reason: str, error: ApiError, worker_fault: bool = True
    ) -> LegFailed:
        """Count a failure (and feed ``ep``'s breaker); the exception to raise."""
        self.pd.failed(f"{side}_{reason}")
        if worker_fault:
            opened = self.breakers.opened
            self.breakers.failure(ep)
            if self.breakers.opened != opened:
                self.metrics.breaker_opened.inc()
        log.warning("pd %s leg on worker %s failed (%s): %s", side, ep.worker_id, reason, error.message)
        return LegFailed(side, ep, f"{side}_{reason}", error)

    async def _open(self, side: str, ep: Endpoint, leg: LegRequest, path: str) -> UpstreamResponse:
        headers = {"Content-Type": "application/json", **leg.headers}
        if self.router_id:  # a record that leads back to this router is seen at the first hop
            headers["Via"] = via_value(None, self.router_id)
        self.breakers.picked(ep)
        hangs = self.hangs
        wait = hangs.begin(ep) if hangs is not None else None
        try:
            resp = await ep.upstream.open(ep, leg.path or path, json.dumps(leg.body).encode(), headers)
        except asyncio.CancelledError:
            if hangs is None or wait is None:
                raise
            hangs.end(wait, False)
            task = asyncio.current_task()
            if not wait.hung or (task is not None and task.uncancel() > 0):
                raise  # not (only) the detector's cancel: the client went away too
            err = ApiError(
                504,
                f"{side.capitalize()} worker {ep.worker_id} accepted its leg and sent nothing for"
                f" {hangs.threshold:g} s (hung); it was taken out of rotation",
                code="upstream_timeout",
            )
            raise self.fail(side, ep, "hung", err, worker_fault=False) from None  # breaker: opened already
        except RequestTooLargeError as exc:
            if hangs is not None:
                hangs.end(wait, False)
            err = ApiError(413, f"Request too large: {exc.reason}", code="request_too_large")
            raise self.fail(side, ep, "too_large", err, worker_fault=False) from None
        except UpstreamError as exc:
            if hangs is not None:
                hangs.end(wait, False)
            err = ApiError(
                504 if exc.timeout else 502,
                f"{side.capitalize()} worker {ep.worker_id} failed before responding: {exc.reason}",
                code="upstream_timeout" if exc.timeout else "upstream_unreachable",
            )
            raise self.fail(side, ep, "timeout" if exc.timeout else "unreachable", err) from None
        except BaseException:
            if hangs is not None:
                hangs.end(wait, False)
            raise
        if hangs is not None:
            hangs.end(wait, True)
        status = resp.status
        if status == LOOP_STATUS and self.router_id and resp.header(LOOP_HEADER) == self.router_id:
            resp.release()
            url = redact_url(ep.record.url)
            self.breakers.isolate(ep, f"its URL {url} leads back to this router (a routing loop)")
            err = loop_error(ep.worker_id, url)
            raise self.fail(side, ep, "loop", err, worker_fault=False)
        if status >= 500 or status == 429:
            try:
                detail = (await resp.read())[:300].decode("utf-8", "replace")
            except _READ_ERRORS:
                detail = ""
            finally:
                resp.release()
            err = ApiError(
                status,
                f"{side.capitalize()} worker {ep.worker_id} answered {status}: {detail}",
                code="upstream_error",
                type="upstream_error" if status >= 500 else None,
            )
            raise self.fail(side, ep, "overloaded" if status == 429 else "error", err, status >= 500)
        return resp

    async def prefill(self, ep: Endpoint, leg: LegRequest, path: str, parse: bool = True) -> dict[str, Any]:
        """Run the prefill leg to completion; its parsed JSON reply (``{}`` when not ``parse``:
        a concurrent-push prefill may even stream, its reply is only drained)."""
        ep.in_flight += 1
        try:
            resp = await self._open("prefill", ep, leg, path)
            try:
                data = await resp.read()
            except _READ_ERRORS as exc:
                err = ApiError(502, f"Prefill worker {ep.worker_id} failed while responding: {exc!r}")
                raise self.fail("prefill", ep, "read_error", err) from None
            finally:
                resp.release()
        finally:
            ep.in_flight -= 1
        if resp.status >= 400:
            raise _client_error(resp.status, data, ep.worker_id)
        if not parse:
            self.breakers.success(ep)
            return {}
        try:
            reply = json.loads(data)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            err = ApiError(
                502, f"Prefill worker {ep.worker_id} answered with something other than a JSON object"
            )
            raise self.fail("prefill", ep, "bad_response", err)
        self.breakers.success(ep)
        return reply

    async def open_decode(self, ep: Endpoint, leg: LegRequest, path: str) -> UpstreamResponse:
        """Open the decode leg; on return the caller owns ``ep.in_flight`` (``RouterCore.release``)."""
        ep.in_flight += 1
        try:
            resp = await self._open("decode", ep, leg, path)
        except BaseException:
            ep.in_flight -= 1
            raise
        if resp.status < 400 or ep.breaker_open:
            self.breakers.success(ep)
        return resp

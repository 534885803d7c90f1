"""The launcher's generation check: does the engine still answer a one-token request?

``GET /health`` only says the HTTP server is up; an engine whose scheduler is stuck
accepts requests and never answers them. :class:`GenerationWatch` sends a one-token
generation every ``interval`` seconds (the adapter's own :class:`HealthGenerate` method,
or :func:`default_health_generate`), and reports when the verdict flips: unhealthy after
``failures`` checks in a row failed (timed out, refused, a 5xx, or a 404/405: no inference
route there, so not an engine), healthy again at the
first success. After a failure the next check starts at once, so with the defaults
(interval 5 s, timeout 10 s, 2 failures) a hung engine is reported within 25 s.
Prefill and decode workers are checked only when their adapter says how
(:func:`checks_generation`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field

from infera_core.engines.base import EngineAdapter, HealthGenerate, RunningEngine
from infera_core.util.api_errors import engine_error
from infera_core.util.redact import redact_url
from infera_core.worker import Role

log = logging.getLogger("infera.launcher")

PROBE_PROMPT = "ping"
NOT_SERVED = (404, 405)
"""Answers that say the inference route is not served: the check fails."""
POOLING_CHECKS: tuple[tuple[str, dict[str, object]], ...] = (
    ("/v1/embeddings", {"input": PROBE_PROMPT}),
    ("/score", {"queries": PROBE_PROMPT, "documents": [PROBE_PROMPT]}),
    ("/classify", {"input": PROBE_PROMPT}),
)
"""What a pooling model (no ``/v1/completions``) is checked with, in turn: an embedding model,
a cross-encoder, a classifier."""


def checks_generation(adapter: EngineAdapter, role: Role) -> bool:
    """Whether the launcher sends this worker generation checks: always with the adapter's own
    :class:`HealthGenerate` method; with the default one only for ``mixed`` workers (a prefill or
    decode leg of a PD engine may wait for transfer parameters a plain request lacks)."""
    return isinstance(adapter, HealthGenerate) or Role(role) is Role.MIXED


async def default_health_generate(engine: RunningEngine) -> bool:
    """POST a ``max_tokens=1`` completion to ``/v1/completions`` (a pooling model: a one-word
    embedding, score or classification, :data:`POOLING_CHECKS`): any answer below 500 proves
    life, except a 404 or 405 that is not an OpenAI-shaped error on every route (none is
    there: whatever answers is not the engine's API).

    No timeout of its own: the caller (:func:`health_generate`) bounds it."""
    body = {"model": engine.model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0.0}
    checks = [("/v1/completions", body), *POOLING_CHECKS]
    for route, sent in checks:  # a pooling model (vLLM --runner pooling) has no /v1/completions
        if route != "/v1/completions":
            sent = {"model": engine.model, **sent}
        resp = await engine.client.post(
            f"{engine.url}{route}",
            json=sent,
            headers={"X-Request-Id": "infera-health-generate"},
            timeout=None,
        )
        if resp.status_code in NOT_SERVED and engine_error(resp.content) is None:
            continue  # not this route: the next kind of model
        if resp.status_code >= 500:
            break
        return True
    log.debug("generation check at %s: HTTP %d", redact_url(engine.url), resp.status_code)
    return False


async def serves_inference(engine: RunningEngine, warned: list[str]) -> bool:
    """Readiness beyond ``GET /health``: the engine's inference API is there. An empty
    ``POST /v1/completions`` (a pooling model: ``/v1/embeddings``, ``/score``, ``/classify``)
    gets an engine's validation error (400/422: nothing runs); a 404, 405 or 501 without an
    API error on each means whatever listens is not an engine (warned once per ``warned``
    list)."""
    for route in ("/v1/completions", *(route for route, _ in POOLING_CHECKS)):
        try:
            resp = await engine.client.post(f"{engine.url}{route}", json={})
        except Exception:  # not answering yet: is_ready decides about that
            return True
        if resp.status_code not in (*NOT_SERVED, 501) or engine_error(resp.content) is not None:
            return True
    if not warned:
        warned.append(engine.url)
        log.warning(
            "%s answers its health check but %d on POST /v1/completions (and /v1/embeddings, /score,"
            " /classify): not an engine's API; not ready",
            redact_url(engine.url),
            resp.status_code,
        )
    return False


async def health_generate(adapter: EngineAdapter, engine: RunningEngine, within: float) -> bool:
    """One generation check, failed unless it answers within ``within`` seconds; never raises."""
    try:
        async with asyncio.timeout(within):
            if isinstance(adapter, HealthGenerate):
                return bool(await adapter.health_generate(engine))
            return await default_health_generate(engine)
    except TimeoutError:
        return False
    except Exception as exc:  # refused, reset, a bad answer: the check failed
        log.debug("generation check at %s failed: %s", redact_url(engine.url), exc)
        return False


@dataclass(eq=False)
class GenerationWatch:
    """Runs generation checks until cancelled; ``on_change(healthy)`` when the verdict flips."""

    check: Callable[[], Awaitable[bool]]
    on_change: Callable[[bool], Awaitable[None]]
    _: KW_ONLY
    worker_id: str
    interval: float
    failures: int
    healthy: bool = field(default=True, init=False)
    failed: int = field(default=0, init=False)

    async def run(self) -> None:
        retry_now = False
        while True:
            if not retry_now:
                await asyncio.sleep(self.interval)
            ok = await self.check()
            retry_now = await self._record(ok)

    async def _record(self, ok: bool) -> bool:
        """Count one result; whether the next check should start at once."""
        if ok:
            self.failed = 0
            if not self.healthy:
                self.healthy = True
                log.warning("worker %s: generation check passed again; back in rotation", self.worker_id)
                await self.on_change(True)
            return False
        self.failed += 1
        if not self.healthy:
            return False
        log.warning("worker %s: generation check failed (%d/%d)", self.worker_id, self.failed, self.failures)
        if self.failed >= self.failures:
            self.healthy = False
            log.warning(
                "worker %s: engine accepts requests but does not answer; out of rotation until it does",
                self.worker_id,
            )
            await self.on_change(False)
            return False
        return True

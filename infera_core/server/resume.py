"""The router's side of migration: which streams may move, cutting them, and resuming them.

:class:`Migrator` belongs to one server. A relay asks :meth:`Migrator.watch` for a
:class:`LiveStream` when its stream may be migrated (``--migration-limit`` above 0 for
the model, and nothing in the request that :func:`~infera_core.server.migrate.refusal`
turns away). The relay keeps the bytes it sent the client; when its worker's stream
breaks it calls :meth:`Migrator.resume`, which dispatches the continuation
(:mod:`infera_core.server.migrate`) to another worker of the same model and role (the
failed ones excluded; the scheduler's KV-aware pick prefers the one holding the prefix).

Streams are also *cut* on purpose, so that they move before they would break: when the
hang detector takes their worker out of rotation, when their worker's record is deleted,
and when their worker has been draining for ``--drain-grace`` seconds. A cut cancels the
relay's task with the stream marked, and the relay migrates it like a broken one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from infera_core.request import RequestContext
from infera_core.scheduling.types import Endpoint
from infera_core.server.core import RouterCore
from infera_core.server.errors import ApiError
from infera_core.server.migrate import (
    MIGRATION_HEADER,
    OFF,
    PROB_ID_ENGINES,
    TOKEN_ID_ENGINES,
    Relayed,
    Resumed,
    asking_ids,
    continuation_body,
    greedy,
    read_relayed,
    refusal,
)
from infera_core.server.splice import StreamTally
from infera_core.transports.upstreams import UpstreamError, UpstreamResponse
from infera_core.worker import Status, WorkerRecord

log = logging.getLogger("infera.server.migrate")

COMPLETIONS_PATH = "/v1/completions"
TEMPLATE_PATH = "/apply-template"
"""llama.cpp's endpoint that renders a chat request's prompt (``{"prompt": "…"}``)."""


class LiveStream:
    """One migratable stream: its task, its worker, and why it was cut (None: not cut)."""

    __slots__ = ("cut", "last", "left", "refused", "tally", "task", "worker")

    def __init__(
        self, task: asyncio.Task[object] | None, worker: str, left: int, refused: str | None = None
    ) -> None:
        self.last = time.perf_counter()
        """When its worker last sent something (the relay's clock)."""
        self.tally: StreamTally | None = None
        """The relay's tally, whose ``last`` the native transport's direct writes advance."""
        self.refused = refused
        """Why this stream is not migratable (it is not tracked then), None when it is."""
        self.task = task
        self.worker = worker
        self.left = left
        """Migrations this stream may still make."""
        self.cut: str | None = None


@dataclass(slots=True, eq=False)
class Leg:
    """A continuation under way: its context, endpoint, response and chunk rewriter."""

    ctx: RequestContext
    ep: Endpoint
    resp: UpstreamResponse
    resumed: Resumed
    started: float
    reason: str


class Migrator:
    """``limit``: migrations per request (``--migration-limit``); ``per_model``: overrides."""

    def __init__(
        self, core: RouterCore, limit: int, per_model: dict[str, int] | None = None, grace: float = 0.0
    ) -> None:
        self.core = core
        self.limit = limit
        self.per_model = per_model or {}
        self.grace = grace
        """``--drain-grace``: seconds a draining worker keeps its streams (0: until it closes them)."""
        self._live: dict[str, set[LiveStream]] = {}
        self._draining: dict[str, asyncio.TimerHandle] = {}
        self._stall_timer: asyncio.TimerHandle | None = None

    def limit_for(self, model: str) -> int:
        return self.per_model.get(model, self.limit)

    def ask_ids(
        self, raw: bytes, body: dict[str, Any], model: str, headers: Any, chat: bool
    ) -> tuple[bytes, dict[str, Any]]:
        """``raw`` and ``body`` asking for the generated token ids when the stream is migratable
        and every worker of its model streams them (:data:`TOKEN_ID_ENGINES`, or
        :data:`PROB_ID_ENGINES` with ``n_probs``); as given otherwise."""
        if (
            body.get("stream") is not True
            or "return_token_ids" in body
            or "n_probs" in body
            or self.limit_for(model) <= 0
            or refusal(body, headers, chat) is not None
        ):
            return raw, body
        engines = {ep.record.engine for ep in self.core.table.candidates(model)}
        if engines and engines <= TOKEN_ID_ENGINES:
            return asking_ids(raw, body)
        if engines and engines <= PROB_ID_ENGINES and not greedy(body):  # greedy: replayed instead
            return asking_ids(raw, body, probs=True)
        return raw, body

    def _mixed(self, model: str) -> bool:
        """Whether every worker of ``model`` takes a mixed prompt (:data:`PROB_ID_ENGINES`)."""
        engines = {ep.record.engine for ep in self.core.table.candidates(model)}
        return bool(engines) and engines <= PROB_ID_ENGINES

    async def _rendered(self, ctx: RequestContext, failed: list[str]) -> str | None:
        """A chat request's prompt as a peer's template renders it (llama.cpp ``/apply-template``);
        None when no peer answers."""
        body = json.dumps(ctx.body).encode()
        for ep in self.core.table.candidates(ctx.model):
            if ep.worker_id in failed or not ep.record.routable:
                continue
            try:
                resp = await ep.upstream.open(ep, TEMPLATE_PATH, body, {"Content-Type": "application/json"})
                try:
                    data = await resp.read() if resp.status == 200 else b""
                finally:
                    resp.release()
                prompt = json.loads(data).get("prompt") if data else None
            except (OSError, ValueError, UpstreamError, AttributeError) as exc:
                log.info("request %s: worker %s rendered no prompt: %r", ctx.log_id, ep.worker_id, exc)
                continue
            if isinstance(prompt, str):
                return prompt
        return None

    def watch(self, ctx: RequestContext, worker: str, chat: bool) -> LiveStream | None:
        """A stream starts relaying from ``worker``: its handle (``refused`` says when it
        cannot move), or None when migration is off for its model."""
        left = self.limit_for(ctx.model)
        if left <= 0:
            return None
        why = refusal(ctx.body, ctx.headers, chat)
        if why is not None:
            return LiveStream(None, worker, 0, why)
        live = LiveStream(asyncio.current_task(), worker, left)
        self._track(live)
        return live

    def _track(self, live: LiveStream) -> None:
        try:
            self._live[live.worker].add(live)
        except KeyError:
            self._live[live.worker] = {live}
        if self._stall_timer is None and self.stall_after() > 0:
            self._stall_timer = asyncio.get_running_loop().call_later(1.0, self._check_stalls)

    def stall_after(self) -> float:
        """Seconds of silence after which a stream's worker is taken as hung mid-stream: the
        hang detector's threshold (``--hang-timeout``; 0 when it is off)."""
        hangs = self.core.hangs
        return hangs.threshold if hangs is not None and hangs.timeout else 0.0

    def _check_stalls(self) -> None:
        """A worker whose streams all went silent past the hang threshold (a SIGSTOP, a wedged
        engine) while a peer can take them: its streams move (reason ``hung``)."""
        self._stall_timer = None
        if not self._live:
            return
        bar = self.stall_after()
        now = time.perf_counter()
        for wid, streams in list(self._live.items()):
            if not streams or not bar:
                continue
            newest = max(
                max(live.last, live.tally.last if live.tally is not None else 0.0) for live in streams
            )
            if now - newest > bar:
                ep = self.core.table.get(wid)
                if ep is not None and self._has_peer(ep.record):
                    log.warning(
                        "worker %s sent nothing on its %d stream(s) for %.1f s",
                        wid,
                        len(streams),
                        now - newest,
                    )
                    self.cut(wid, "hung")
        if self._live and bar:
            self._stall_timer = asyncio.get_running_loop().call_later(1.0, self._check_stalls)

    def done(self, live: LiveStream | None) -> None:
        if live is not None:
            streams = self._live.get(live.worker)
            if streams is not None:
                streams.discard(live)
                if not streams:
                    del self._live[live.worker]

    def cut(self, worker: str, reason: str) -> int:
        """Move every migratable stream of ``worker`` elsewhere; how many were cut."""
        n = 0
        for live in list(self._live.get(worker, ())):
            if live.cut is None and live.task is not None and not live.task.done():
                live.cut = reason
                live.task.cancel()
                n += 1
        if n:
            log.warning("worker %s: %d stream(s) moved to other workers (%s)", worker, n, reason)
        return n

    # -- fleet events ----------------------------------------------------------------
    def on_worker_changed(self, record: WorkerRecord) -> None:
        wid = record.worker_id
        if record.status is Status.DRAINING and self.grace > 0:
            if wid not in self._draining:
                self._arm_drain(record)
        else:
            timer = self._draining.pop(wid, None)
            if timer is not None:
                timer.cancel()

    def on_worker_removed(self, record: WorkerRecord) -> None:
        timer = self._draining.pop(record.worker_id, None)
        if timer is not None:
            timer.cancel()
        if self._has_peer(record):  # else its streams may still finish: nowhere to move them
            self.cut(record.worker_id, "worker_gone")

    def _arm_drain(self, record: WorkerRecord) -> None:
        loop = asyncio.get_running_loop()
        self._draining[record.worker_id] = loop.call_later(self.grace, self._drain_over, record)

    def _drain_over(self, record: WorkerRecord) -> None:
        if not self._has_peer(record):  # look again later: a peer may join
            self._arm_drain(record)
            return
        self._draining.pop(record.worker_id, None)
        self.cut(record.worker_id, "drain")

    def _has_peer(self, record: WorkerRecord) -> bool:
        """Whether another routable worker serves ``record``'s model in its role."""
        return any(
            ep.worker_id != record.worker_id
            and ep.record.routable
            and not ep.breaker_open
            and ep.record.role == record.role
            for ep in self.core.table.candidates(record.model)
        )

    def on_hung(self, ep: Endpoint) -> None:
        self.cut(ep.worker_id, "hung")

    # -- resuming ----------------------------------------------------------------------
    async def resume(
        self,
        ctx: RequestContext,
        path: str,
        kept: bytes,
        live: LiveStream,
        failed: list[str],
        reason: str,
        chat: bool,
    ) -> Leg | Relayed | str:
        """The continuation of a stream that broke (``reason``) after relaying ``kept``:
        a :class:`Leg`, the :class:`Relayed` state when the stream had in fact ended
        (its finish reason was relayed), or why it cannot go on."""
        started = time.perf_counter()
        self.done(live)  # off its worker's list first: a cut now (its record deleted) must not cancel this
        metrics = self.core.metrics
        r = read_relayed(kept, chat)
        if r.finish is not None:
            metrics.migrated(ctx.model, reason, "finished", None)
            return r
        if live.left <= 0:
            metrics.migrated(ctx.model, reason, "limit", None)
            return f"the migration limit ({self.limit_for(ctx.model)}) is spent"
        if r.tools:
            metrics.migrated(ctx.model, reason, "refused", None)
            return "a tool call was under way"
        mixed = self._mixed(ctx.model)
        # llama.cpp, greedy: the request again, whole, the relayed part skipped; it decodes the same
        # tokens one by one as the first worker did (the generated ids re-read as a prompt are
        # computed batched, which can flip a near-tie: the random tiny model's greedy pick did)
        replay = mixed and greedy(ctx.body)
        rendered = None
        if mixed and not replay and chat and r.token_ids is not None and r.prompt_token_ids is None:
            rendered = await self._rendered(ctx, failed)
        body = dict(ctx.body) if replay else continuation_body(ctx.body, r, chat, rendered, mixed)
        if isinstance(body, str):
            metrics.migrated(ctx.model, reason, "refused", None)
            return body
        as_chat = chat and "prompt" in body  # token-exact: a completion stands in for the chat
        if as_chat:
            path = COMPLETIONS_PATH
        live.left -= 1
        leg_ctx = ctx.continued(self.core.request_id(), body)
        try:
            ep, resp = await self.core.dispatch(leg_ctx, path, json.dumps(body).encode(), exclude=failed)
        except ApiError as err:
            metrics.migrated(ctx.model, reason, "failed", None)
            return f"no worker could take it over ({err.message})"
        if resp.status >= 400:
            resp.release()
            self.core.release(leg_ctx, ep, False)
            metrics.migrated(ctx.model, reason, "failed", None)
            return f"worker {ep.worker_id} refused the continuation ({resp.status})"
        log.info(
            "request %s: stream of worker %s broke (%s) after %d token(s); continuing on worker %s (%s)",
            ctx.log_id,
            live.worker,
            reason,
            r.generated,
            ep.worker_id,
            "replayed whole, the relayed part skipped"
            if replay
            else "token ids replayed"
            if r.token_ids is not None
            else "text re-sent",
        )
        live.worker = ep.worker_id
        live.cut = None
        live.last = time.perf_counter()
        self._track(live)
        return Leg(leg_ctx, ep, resp, Resumed(r, chat, as_chat, replay), started, reason)

    def whole_retries(self, ctx: RequestContext) -> int:
        """How often a non-streamed request whose answer broke is sent again, whole."""
        opt = ctx.headers.get(MIGRATION_HEADER)
        if isinstance(opt, str) and opt.strip().lower() in OFF:
            return 0
        return self.limit_for(ctx.model)

    async def retry_whole(
        self, ctx: RequestContext, path: str, failed: list[str]
    ) -> tuple[RequestContext, Endpoint, UpstreamResponse] | str:
        """A non-streamed request whose answer broke, sent again to another worker (the client
        has received nothing yet, so any answer will do)."""
        started = time.perf_counter()
        again = ctx.continued(self.core.request_id(), ctx.body)
        try:
            ep, resp = await self.core.dispatch(again, path, json.dumps(ctx.body).encode(), exclude=failed)
        except ApiError as err:
            self.core.metrics.migrated(ctx.model, "upstream_closed", "failed", None)
            return f"no worker could take it over ({err.message})"
        self.core.metrics.migrated(ctx.model, "upstream_closed", "resumed", time.perf_counter() - started)
        return again, ep, resp

    def resumed(self, ctx: RequestContext, leg: Leg) -> None:
        """The continuation's first bytes reached the client."""
        self.core.metrics.migrated(ctx.model, leg.reason, "resumed", time.perf_counter() - leg.started)


def uncancel() -> int:
    """Undo one cancel request of the current task (a cut's); how many remain."""
    task = asyncio.current_task()
    return task.uncancel() if task is not None else 0

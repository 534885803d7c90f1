"""Routing tokenization: which tokenizer a model uses, and token ids per request (cached).

Which tokenizer (first match wins):

1. ``--tokenizer MODEL=NAME[:PATH]`` (``NAME`` a registered tokenizer, e.g. ``hf``);
2. a worker record's label ``infera.tokenizer`` = ``NAME[:PATH]``, or ``engine``: the
   worker's own ``/tokenize`` (:mod:`.engine`; its launcher sets that label when it found no
   tokenizer files for a model card but the engine answers ``/tokenize``);
3. a worker's ``kv_events.fingerprint`` of a known family (``infera-sim-v1:vocab=N`` →
   ``sim``), so ``infera-run up`` with sim workers needs no configuration;
4. the model card a worker published (``model_card`` in its record; fetched, verified and
   cached by :mod:`infera_core.tokenize.cards`, then built as ``hf:<the card's files>``),
   so real engines need no configuration either.

Token-id prompts are used as given. Each request is tokenized at most once (the
result lands in ``RequestContext.token_ids``), long prompts off the event loop (two
threads of its own; the ``hf`` tokenizer releases the GIL while encoding), and results are kept in a
LRU keyed by (model, digest of the prompt), bounded in entries and in bytes.

Routing needs a prefix of the prompt, never all of it: the text is cut to
``max_chars`` characters (``--tokenize-max-chars``, and 8 a token of
``--routing-max-tokens``) *before* it is tokenized (a chat: its template is rendered,
then cut), the few tokens next to the cut are dropped (the text that followed could
have merged with them) and at most ``max_tokens`` ids are kept. So a 31 MB prompt costs
the router what a 256 KiB one does. A prompt longer than the cut, or whose ids would
take over an eighth of the cache, is not cached. Chat requests of tokenizers that
can render their template (:class:`~infera_core.tokenize.base.PrefixTokenizer`) are
tokenized incrementally: a turn that extends an earlier conversation only tokenizes
its new suffix (:mod:`infera_core.tokenize.incremental`, bounded by bytes). A failure
leaves ``token_ids`` empty and sets ``ctx.tokenize_failed``: the request is still
routed (by its text prefix under ``kv-aware``, else by load),
``infera_routing_tokenize_failures_total`` counts it and a warning says why — at most
one per model per ``--tokenize-warn-interval-s``, with the count of lines held back.
A model without any routing tokenizer is reported once, by the server (its routing
mode), not per request; a model no worker serves is not tokenized and logs nothing
(the request gets its 404).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from infera_core.errors import ConfigError, InferaError, UnknownNameError
from infera_core.request import RequestContext
from infera_core.tokenize.base import PrefixTokenizer, Tokenizer
from infera_core.tokenize.cards import ModelCards
from infera_core.tokenize.engine import EngineTokenize
from infera_core.tokenize.incremental import PrefixTokenCache
from infera_core.tokenize.prompt import (
    completion_prompt,
    cut_contents,
    cut_messages,
    given_tokens,
    ids_bytes,
    prompt_size,
    shared_prefix,
)
from infera_core.tokenize.specs import ENGINE, TokenizerSpec, spec_from_record
from infera_core.util.memory import trim
from infera_core.util.throttle import LogThrottle
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.tokenize")

_RENDER_FIELDS = (
    "add_generation_prompt",
    "continue_final_message",
    "chat_template",
    "chat_template_kwargs",
    "reasoning_effort",
    "add_special_tokens",
)

CHARS_PER_TOKEN = 8
"""Characters of text cut per token of ``--routing-max-tokens`` (more than any real
tokenizer's average, so the cut rarely costs a routing token)."""
CUT_MARGIN = 8
"""Tokens dropped before a cut: the text that followed could have merged with them."""


class _Entry:
    __slots__ = ("error", "spec", "tokenizer")

    def __init__(self, spec: TokenizerSpec) -> None:
        self.spec = spec
        self.tokenizer: Tokenizer | None = None
        self.error: str | None = None


class RoutingTokenizers:
    """Per-model routing tokenizers built from the catalog's tokenizer factories."""

    def __init__(
        self,
        factories: Any,
        configured: dict[str, TokenizerSpec] | None = None,
        cache_size: int = 4096,
        offload_chars: int = 4096,
        prefix_cache_bytes: int = 256 << 20,
        prefix_wait_ms: float = 20.0,
        cache_bytes: int = 64 << 20,
        max_chars: int = 262_144,
        max_tokens: int = 65_536,
        threads: int = 2,
        warn_interval_s: float = 60.0,
        cards: ModelCards | None = None,
    ) -> None:
        self.factories = factories
        self.configured = dict(configured or {})
        self.cache_size = cache_size
        self.cache_bytes = cache_bytes
        self.cache_held = 0
        """Approximate bytes of the token ids in the cache."""
        self.offload_chars = offload_chars
        self.max_tokens = max_tokens
        self.max_chars = min(max_chars, max_tokens * CHARS_PER_TOKEN) if max_tokens else max_chars
        """Characters of a prompt (a chat: of its rendered template) ever tokenized for routing."""
        self._models: dict[str, _Entry] = {}
        self._cache: OrderedDict[tuple[str, bytes], tuple[list[int], int]] = OrderedDict()
        self.failures: dict[str, int] = {}
        self.counts: dict[tuple[str, str], int] = {}
        self.cut: dict[str, int] = {}
        """Prompts cut before tokenizing, per model."""
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="infera-tokenize")
        """Long prompts are tokenized here, ``threads`` at a time: the memory they take at
        once (and keep in the threads' allocator arenas) is bounded, whatever the load."""
        self._enc = msgspec.json.Encoder()
        self.prefixes = PrefixTokenCache(prefix_cache_bytes)
        self.prefix_wait_s = prefix_wait_ms / 1e3
        self.served: dict[str, set[str]] = {}
        """model → the workers serving it (requests for other models are not tokenized)."""
        self.throttle = LogThrottle(warn_interval_s)
        self.cards = cards or ModelCards()
        self.cards.on_loaded = self._card_loaded
        self._tasks: set[asyncio.Task[None]] = set()
        self.engine = EngineTokenize()

    # -- which tokenizer ------------------------------------------------------------------
    def observe_worker(self, record: WorkerRecord) -> None:
        """Learn a model's tokenizer from a worker record when none is configured."""
        self.served.setdefault(record.model, set()).add(record.worker_id)
        if record.model in self.configured:
            return
        spec = spec_from_record(record)  # a label, or the engine's own tokenizer family (sim)
        if spec is not None and spec[0] == ENGINE:
            self.engine.observe(record)
            return
        if spec is None and record.model_card is not None:
            self.cards.observe(record)  # every record: workers with another digest are reported
            return
        if spec is not None and record.model not in self._models:
            self._models[record.model] = _Entry(spec)

    def forget_worker(self, record: WorkerRecord) -> None:
        self.cards.forget(record.worker_id)
        self.engine.forget(record.worker_id)
        workers = self.served.get(record.model)
        if workers is not None:
            workers.discard(record.worker_id)
            if not workers:
                del self.served[record.model]

    def missing(self, model: str) -> str | None:
        """Why ``model`` has no routing tokenizer (None: it has one)."""
        if self.tokenizer_for(model, quiet=True) is not None:
            return None
        entry = self._models.get(model)
        if entry is not None and entry.error:
            return f"routing tokenizer {entry.spec[0]!r} unavailable: {entry.error}"
        return "no routing tokenizer for this model"

    def card_info(self, worker_id: str) -> dict[str, str] | None:
        """``/v1/workers``' ``model_card`` of a worker: its digest and what the router did with it."""
        for model, seen in self.cards.digests.items():
            digest = seen.get(worker_id)
            if digest is None:
                continue
            state = self.cards.models.get(model)
            entry = self._models.get(model)
            if model in self.configured:
                status = "not used: --tokenizer overrides it"
            elif state is None or state.digest != digest:
                status = f"not used: the router uses {state.digest if state else None} for this model"
            elif state.files is not None and entry is not None:
                status = "in use" if entry.tokenizer is not None else f"failed: {entry.error}"
            else:
                status = state.status
            return {"digest": digest, "status": status}
        return None

    def _card_loaded(self, model: str, files: Path) -> None:
        """Build the card's tokenizer off the event loop, then route ``model`` with it."""
        entry = _Entry(("hf", {"path": str(files)}))

        def build() -> None:
            try:
                entry.tokenizer = self.factories.get("hf").create(model, entry.spec[1])
            except (InferaError, UnknownNameError, OSError, ValueError) as exc:
                entry.error = str(exc)
                log.error("model %s: the model card's tokenizer is unusable: %s", model, exc)

        async def install() -> None:
            await asyncio.to_thread(build)
            if model not in self.configured and model not in self._models:
                self._models[model] = entry

        self._tasks.add(task := asyncio.get_running_loop().create_task(install()))
        task.add_done_callback(self._tasks.discard)

    def tokenizer_for(self, model: str, quiet: bool = False) -> Tokenizer | None:
        entry = self._models.get(model)
        if entry is None:
            spec = self.configured.get(model)
            if spec is None:
                return None
            entry = self._models[model] = _Entry(spec)
        if entry.tokenizer is None and entry.error is None:
            name, options = entry.spec
            try:
                entry.tokenizer = self.factories.get(name).create(model, options)
            except (InferaError, UnknownNameError, OSError, ValueError) as exc:
                entry.error = str(exc)
                if not quiet:
                    log.error("model %s: routing tokenizer %r unavailable: %s", model, name, exc)
        return entry.tokenizer

    def check_all(self) -> None:
        """Build every configured tokenizer now (start-up): bad paths fail as ConfigError."""
        for model in self.configured:
            if self.tokenizer_for(model, quiet=True) is None:
                err = self._models[model].error
                raise ConfigError(f"--tokenizer {model}=…: {err}")

    def fingerprint(self, model: str) -> str | None:
        tok = self.tokenizer_for(model)
        return tok.fingerprint if tok is not None else None

    # -- per request ----------------------------------------------------------------------
    async def fill(self, ctx: RequestContext) -> None:
        """Set ``ctx.token_ids`` once (or ``ctx.tokenize_failed``)."""
        if ctx.token_ids is not None or ctx.tokenize_failed:
            return
        model = ctx.base_model  # a LoRA adapter's prompt is tokenized by its base model
        given = given_tokens(ctx.body)
        if given is not None:
            ctx.token_ids = given
            self._count(model, "given")
            return
        tok = self.tokenizer_for(model)
        engine = tok is None and self.engine.serves(model)
        if tok is None and not engine:
            if model not in self.served:  # unknown model: it gets its 404, nothing to say here
                ctx.tokenize_failed = True
                return
            card = self.cards.models.get(model)
            if card is not None:
                self._failed(ctx, f"model card {card.status}")
            else:
                self._failed(ctx, "no routing tokenizer for this model", quiet=True)
            return
        size = prompt_size(ctx.body)
        key = None
        if self.cache_size and self.cache_bytes and size <= self.max_chars:
            key = (model, self._digest(ctx))
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                ctx.token_ids = hit[0]
                self._count(model, "cache")
                return
        try:
            if tok is None:
                ids, whole, source = await self.engine.tokenize(ctx), True, "engine"
            elif size > self.offload_chars:
                ids, whole = await self._offloaded(tok, ctx)
                source = "tokenizer" if whole else "prefix"
            else:
                ids, whole, source = self._encode(tok, ctx), True, "tokenizer"
        except Exception as exc:
            self._failed(ctx, f"{type(exc).__name__}: {exc}")
            return
        ctx.token_ids = ids
        self._count(model, source)
        if whole and key is not None:
            self._remember(key, ids)

    def _remember(self, key: tuple[str, bytes], ids: list[int]) -> None:
        """Cache ``ids`` unless they would take over an eighth of the cache's bytes."""
        cost = ids_bytes(ids)
        if cost > self.cache_bytes // 8 or key in self._cache:
            return
        self._cache[key] = (ids, cost)
        self.cache_held += cost
        while len(self._cache) > self.cache_size or self.cache_held > self.cache_bytes:
            self.cache_held -= self._cache.popitem(last=False)[1][1]

    def _digest(self, ctx: RequestContext) -> bytes:
        b = ctx.body
        parts = (ctx.route, b.get("messages"), b.get("prompt"), b.get("tools"), b.get("documents"))
        extra = tuple(b.get(k) for k in _RENDER_FIELDS)
        return hashlib.blake2b(self._enc.encode((parts, extra)), digest_size=16).digest()

    async def _offloaded(self, tok: Tokenizer, ctx: RequestContext) -> tuple[list[int], bool]:
        """Tokenize in a thread; after ``prefix_wait_s`` settle for the conversation prefix
        already known (if any): routing then uses its blocks while the suffix is still being
        tokenized (the result still lands in the prefix cache for the next turn)."""
        known: list[list[int]] = []
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._pool, self._encode, tok, ctx, known.append)
        if self.prefix_wait_s > 0:
            done, _ = await asyncio.wait({fut}, timeout=self.prefix_wait_s)
            if not done and known:
                fut.add_done_callback(_consume)
                return self._bound(known[0], False), False
        return await fut, True

    def _encode(
        self, tok: Tokenizer, ctx: RequestContext, on_prefix: Callable[[list[int]], object] | None = None
    ) -> list[int]:
        """Token ids of the first ``max_chars`` characters of the request's prompt (see the
        module docstring), at most ``max_tokens``."""
        body = ctx.body
        limit = self.max_chars
        messages = body.get("messages")
        if isinstance(messages, list):
            # /v1/messages requests arrive here already mapped to the chat request the
            # engine receives (server/anthropic.py), so both render the same way.
            if isinstance(tok, PrefixTokenizer) and not body.get("add_special_tokens"):
                cut = prompt_size(body) > limit
                if cut:  # what is rendered is bounded too, not only what is tokenized
                    messages = cut_contents(messages, limit)
                text = tok.render_chat(messages, body)
                cut = cut or len(text) > limit
                scope = f"{ctx.model}\0{tok.fingerprint}"
                ids = self.prefixes.encode(
                    scope, text[:limit] if cut else text, tok.encode_offsets, on_prefix
                )
            else:
                cut = prompt_size(body) > limit
                ids = tok.encode_chat(cut_messages(messages, limit) if cut else messages, body)
                if cut:  # the template's closing follows the cut: keep what a shorter cut shares
                    ids = ids[: shared_prefix(ids, tok.encode_chat(cut_messages(messages, limit - 64), body))]
        else:
            prompt = completion_prompt(body)
            cut = len(prompt) > limit
            ids = tok.encode(prompt[:limit] if cut else prompt)
        if cut:
            with self._lock:
                self.cut[ctx.model] = self.cut.get(ctx.model, 0) + 1
            ids = self._bound(ids, cut)
            trim()  # the tokenizer's freed working memory back to the OS, not kept by the arena
            return ids
        return self._bound(ids, cut)

    def _bound(self, ids: list[int], cut: bool) -> list[int]:
        """``ids`` less the tokens next to a cut, at most ``max_tokens`` of them."""
        end = len(ids) - CUT_MARGIN if cut else len(ids)
        if self.max_tokens:
            end = min(end, self.max_tokens)
        return ids if end >= len(ids) else ids[: max(0, end)]

    def _failed(self, ctx: RequestContext, why: str, quiet: bool = False) -> None:
        """Count the failure; warn (throttled per model) unless the model's routing mode
        already says it (``quiet``: no tokenizer at all, reported once per model)."""
        ctx.tokenize_failed = True
        self.failures[ctx.model] = self.failures.get(ctx.model, 0) + 1
        if quiet:
            log.debug("request %s: not tokenized for routing (%s)", ctx.request_id, why)
            return
        held = self.throttle.allow(ctx.model)
        if held is not None:
            log.warning(
                "request %s (model %s): not tokenized for routing (%s); routed without token ids%s",
                ctx.request_id,
                ctx.model,
                why,
                self.throttle.note(held),
            )

    def _count(self, model: str, source: str) -> None:
        k = (model, source)
        self.counts[k] = self.counts.get(k, 0) + 1

    def collect(self) -> Iterable[Any]:
        fails = CounterMetricFamily(
            "infera_routing_tokenize_failures",
            "Requests routed without token ids (tokenizer missing or failed)",
            labels=["model"],
        )
        for model, n in self.failures.items():
            fails.add_metric([model], n)
        done = CounterMetricFamily(
            "infera_routing_tokenized", "Requests with token ids, by source", labels=["model", "source"]
        )
        for (model, source), n in self.counts.items():
            done.add_metric([model, source], n)
        cut = CounterMetricFamily(
            "infera_routing_tokenize_cut",
            "Prompts longer than --tokenize-max-chars: routed on the tokens of their first characters only",
            labels=["model"],
        )
        for model, n in self.cut.items():
            cut.add_metric([model], n)
        cached = GaugeMetricFamily(
            "infera_routing_tokenize_cache_bytes",
            "Approximate bytes of the prompt token ids cached for routing",
        )
        cached.add_metric([], self.cache_held)
        p = self.prefixes
        inc = CounterMetricFamily(
            "infera_routing_tokenize_prefix",
            "Incremental chat tokenization: requests that reused a cached conversation prefix (hit), "
            "found none (miss), or failed the boundary check (fallback)",
            labels=["outcome"],
        )
        for outcome, n in (("hit", p.hits), ("miss", p.misses), ("fallback", p.fallbacks)):
            inc.add_metric([outcome], n)
        reused = CounterMetricFamily(
            "infera_routing_tokenize_prefix_tokens",
            "Tokens of incrementally tokenized chat prompts, reused from the cache or tokenized",
            labels=["source"],
        )
        reused.add_metric(["reused"], p.reused_tokens)
        reused.add_metric(["tokenized"], p.new_tokens)
        held = GaugeMetricFamily(
            "infera_routing_tokenize_prefix_cache_bytes",
            "Approximate bytes held by the conversation-prefix cache",
        )
        held.add_metric([], p.bytes)
        yield fails
        yield done
        yield cut
        yield cached
        yield inc
        yield reused
        yield held


def _consume(fut: asyncio.Future[list[int]]) -> None:
    """Retrieve a background tokenization's outcome (its failure is not the request's)."""
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("background tokenization failed: %s", fut.exception())

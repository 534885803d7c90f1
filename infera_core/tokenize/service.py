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
result lands in ``RequestContext.token_ids``), long prompts off the event loop (the
default thread pool; the ``hf`` tokenizer releases the GIL while encoding), and results are kept in a
bounded LRU keyed by (model, digest of the prompt). Chat requests of tokenizers that
can render their template (:class:`~infera_core.tokenize.base.PrefixTokenizer`) are
tokenized incrementally: a turn that extends an earlier conversation only tokenizes
its new suffix (:mod:`infera_core.tokenize.incremental`, bounded by bytes). A failure
leaves ``token_ids`` empty and sets ``ctx.tokenize_failed``: the request is still
routed (by load) and ``infera_routing_tokenize_failures_total`` counts it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
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
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.tokenize")

LABEL = "infera.tokenizer"
ENGINE = "engine"
"""``infera.tokenizer=engine``: ask the worker's own ``/tokenize`` (:mod:`.engine`)."""
_RENDER_FIELDS = (
    "add_generation_prompt",
    "continue_final_message",
    "chat_template",
    "chat_template_kwargs",
    "reasoning_effort",
    "add_special_tokens",
)
TokenizerSpec = tuple[str, dict[str, Any]]


def parse_spec(text: str) -> TokenizerSpec:
    """``NAME[:PATH]`` → (name, options)."""
    name, sep, path = text.partition(":")
    if not name:
        raise ValueError(f"empty tokenizer name in {text!r}")
    return name, ({"path": path} if sep and path else {})


def parse_model_specs(values: Iterable[str], flag: str = "--tokenizer") -> dict[str, TokenizerSpec]:
    """``MODEL=NAME[:PATH]`` flags → {model: spec}; a bad value raises :class:`ConfigError`."""
    out: dict[str, TokenizerSpec] = {}
    for v in values:
        model, sep, spec = v.partition("=")
        if not sep or not model or not spec:
            raise ConfigError(f"{flag} {v!r}: expected MODEL=NAME[:PATH], e.g. llama=hf:/models/llama")
        try:
            out[model] = parse_spec(spec)
        except ValueError as exc:
            raise ConfigError(f"{flag} {v!r}: {exc}") from None
    return out


def spec_from_record(record: WorkerRecord) -> TokenizerSpec | None:
    """The tokenizer a worker record names (label, or a known fingerprint family)."""
    label = record.labels.get(LABEL)
    if label:
        try:
            return parse_spec(label)
        except ValueError:
            return None
    fp = record.kv_events.fingerprint if record.kv_events else None
    if fp and fp.startswith("infera-sim-v1:"):
        opts: dict[str, Any] = {}
        for part in fp.split(":", 1)[1].split(","):
            k, _, v = part.partition("=")
            if k == "vocab" and v.isdigit():
                opts["vocab_size"] = int(v)
        return "sim", opts
    return None


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
        cards: ModelCards | None = None,
    ) -> None:
        self.factories = factories
        self.configured = dict(configured or {})
        self.cache_size = cache_size
        self.offload_chars = offload_chars
        self._models: dict[str, _Entry] = {}
        self._cache: OrderedDict[tuple[str, bytes], list[int]] = OrderedDict()
        self.failures: dict[str, int] = {}
        self.counts: dict[tuple[str, str], int] = {}
        self._enc = msgspec.json.Encoder()
        self.prefixes = PrefixTokenCache(prefix_cache_bytes)
        self.prefix_wait_s = prefix_wait_ms / 1e3
        self.cards = cards or ModelCards()
        self.cards.on_loaded = self._card_loaded
        self._tasks: set[asyncio.Task[None]] = set()
        self.engine = EngineTokenize()

    # -- which tokenizer ------------------------------------------------------------------
    def observe_worker(self, record: WorkerRecord) -> None:
        """Learn a model's tokenizer from a worker record when none is configured."""
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

    def forget_worker(self, worker_id: str) -> None:
        self.cards.forget(worker_id)
        self.engine.forget(worker_id)

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
        given = _given_tokens(ctx.body)
        if given is not None:
            ctx.token_ids = given
            self._count(ctx.model, "given")
            return
        tok = self.tokenizer_for(ctx.model)
        engine = tok is None and self.engine.serves(ctx.model)
        if tok is None and not engine:
            card = self.cards.models.get(ctx.model)
            self._failed(ctx, f"model card {card.status}" if card else "no routing tokenizer for this model")
            return
        key = (ctx.model, self._digest(ctx))
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            ctx.token_ids = hit
            self._count(ctx.model, "cache")
            return
        try:
            if tok is None:
                ids, whole, source = await self.engine.tokenize(ctx), True, "engine"
            elif _size(ctx.body) > self.offload_chars:
                ids, whole = await self._offloaded(tok, ctx)
                source = "tokenizer" if whole else "prefix"
            else:
                ids, whole, source = self._encode(tok, ctx), True, "tokenizer"
        except Exception as exc:
            self._failed(ctx, f"{type(exc).__name__}: {exc}")
            return
        ctx.token_ids = ids
        self._count(ctx.model, source)
        if not whole:
            return
        if self.cache_size:
            self._cache[key] = ids
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

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
        fut = asyncio.ensure_future(asyncio.to_thread(self._encode, tok, ctx, known.append))
        if self.prefix_wait_s > 0:
            done, _ = await asyncio.wait({fut}, timeout=self.prefix_wait_s)
            if not done and known:
                fut.add_done_callback(_consume)
                return known[0], False
        return await fut, True

    def _encode(
        self, tok: Tokenizer, ctx: RequestContext, on_prefix: Callable[[list[int]], object] | None = None
    ) -> list[int]:
        body = ctx.body
        messages = body.get("messages")
        if isinstance(messages, list):
            # /v1/messages requests arrive here already mapped to the chat request the
            # engine receives (server/anthropic.py), so both render the same way.
            if isinstance(tok, PrefixTokenizer) and not body.get("add_special_tokens"):
                text = tok.render_chat(messages, body)
                scope = f"{ctx.model}\0{tok.fingerprint}"
                return self.prefixes.encode(scope, text, tok.encode_offsets, on_prefix)
            return tok.encode_chat(messages, body)
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = prompt[0] if prompt else ""
        if not isinstance(prompt, str):
            raise ValueError("no prompt or messages to tokenize")
        return tok.encode(prompt)

    def _failed(self, ctx: RequestContext, why: str) -> None:
        ctx.tokenize_failed = True
        self.failures[ctx.model] = self.failures.get(ctx.model, 0) + 1
        log.warning("request %s: not tokenized for routing (%s); routed by load only", ctx.request_id, why)

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
        yield inc
        yield reused
        yield held


def _consume(fut: asyncio.Future[list[int]]) -> None:
    """Retrieve a background tokenization's outcome (its failure is not the request's)."""
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("background tokenization failed: %s", fut.exception())


def _given_tokens(body: dict[str, Any]) -> list[int] | None:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):
            return prompt if all(isinstance(t, int) for t in prompt) else None
        if isinstance(first, list) and first and all(isinstance(t, int) for t in first):
            return first
    return None


def _size(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt)
    messages = body.get("messages")
    if isinstance(messages, list):
        n = 0
        for m in messages:
            c = m.get("content") if isinstance(m, dict) else None
            n += len(c) if isinstance(c, str) else len(str(c))
        return n
    return 0

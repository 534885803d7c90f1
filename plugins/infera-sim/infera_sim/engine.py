"""The sim's engine core: one asyncio step loop doing continuous batching over a KV cache.

Each step schedules running requests first (one decode token each, or the next prefill
chunk), then admits waiting requests while ``max_num_seqs`` and the KV cache allow,
within a token budget of ``max_num_batched_tokens`` (chunked prefill). A step lasts
``prefill_tokens / prefill_tokens_per_s`` (plus ``prefill_base_ms`` when it prefills) plus, when
anything decodes, ``itl_base_ms + itl_slope_ms × running``, plus ``loaded tokens / cpu_load_tokens_per_s``
for prefixes loaded back from the CPU tier (``--cpu-blocks``). Time is simulated: with a finite
``--speedup`` the loop sleeps ``step / speedup``; with ``inf`` it never sleeps. Metrics
record simulated seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from infera_core.kv.events import KvEvent
from infera_sim.config import SimConfig
from infera_sim.kvcache import KvCache, block_hashes, chain_hash, salt_root
from infera_sim.metrics import SimMetrics
from infera_sim.request import SimRequest
from infera_sim.tokenizer import EOS_ID, EngineTokenizer

log = logging.getLogger("infera_sim.engine")
Publish = Callable[[float, list[KvEvent]], object]


class SimEngine:
    """Schedules :class:`SimRequest` objects; ``run()`` is the step loop task."""

    def __init__(self, cfg: SimConfig, tokenizer: EngineTokenizer, publish: Publish | None = None) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.cache = KvCache(cfg.cache_blocks, cfg.block_size, cpu_blocks=cfg.cpu_blocks)
        self.metrics = SimMetrics(cfg.model)
        self.metrics.offload = cfg.cpu_blocks > 0
        self.publish = publish
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.sim_time = 0.0
        self.steps = 0
        self._vocab = tokenizer.output_vocab()
        self._work = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wall0 = 0.0
        self._load_tokens = 0
        """Tokens loaded from the CPU tier by the requests admitted in the step being planned."""
        self.held = 0
        """Requests accepted outside the step loop (``--fault-hang``, PD waits): counted as waiting."""

    # -- public API ------------------------------------------------------------------------
    def now(self) -> float:
        """Current simulated time in seconds."""
        if self.cfg.sleeps and self._loop is not None:
            return max(self.sim_time, (self._loop.time() - self._wall0) * self.cfg.speedup)
        return self.sim_time

    def blocks_needed(self, prompt_len: int, max_tokens: int) -> int:
        return -(-(prompt_len + max_tokens) // self.cfg.block_size)

    def add(self, req: SimRequest) -> None:
        req.arrival = self.now()
        self._wait(req)
        self._work.set()

    def _wait(self, req: SimRequest) -> None:
        """Queue ``req``: at the back (``fcfs``), or (``--scheduling-policy priority``, as vLLM's
        priority queue) before the first waiter of a larger ``(priority, arrival)``."""
        waiting = self.waiting
        if self.cfg.scheduling_policy != "priority" or not waiting or waiting[-1].priority <= req.priority:
            waiting.append(req)
            return
        rank = (req.priority, req.arrival)
        for i, other in enumerate(waiting):
            if (other.priority, other.arrival) > rank:
                waiting.insert(i, req)
                return
        waiting.append(req)

    def abort(self, req: SimRequest) -> None:
        """The client went away: free what the request holds."""
        if req.done:
            return
        if req in self.running:
            self.running.remove(req)
            self._release(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.done = True
        self.metrics.success["abort"] = self.metrics.success.get("abort", 0) + 1

    def reset_prefix_cache(self) -> bool:
        ok = self.cache.reset()
        if ok:
            self._flush_events()
        return ok

    async def run(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._wall0 = loop.time()
        speedup = self.cfg.speedup
        sleeps = self.cfg.sleeps
        while True:
            if not self.running and not self.waiting:
                self._work.clear()
                await self._work.wait()
            if sleeps:
                self.sim_time = self.now()
            plan, duration = self._plan()
            if not plan:  # nothing admissible: wait for a release or a new request
                self._work.clear()
                await self._work.wait()
                continue
            self.sim_time += duration
            self.steps += 1
            if sleeps:
                delay = self._wall0 + self.sim_time / speedup - loop.time()
                await asyncio.sleep(delay if delay > 0 else 0)
            else:
                await asyncio.sleep(0)
            self._execute(plan, self.sim_time)
            self._flush_events()

    # -- scheduling ------------------------------------------------------------------------
    def _plan(self) -> tuple[list[tuple[SimRequest, int]], float]:
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        plan: list[tuple[SimRequest, int]] = []
        prefill_tokens = 0
        self._load_tokens = 0
        decoding = 0
        for r in self.running:
            if budget <= 0:
                break
            if r.num_computed < r.target:
                chunk = min(r.target - r.num_computed, budget)
                prefill_tokens += chunk
            else:
                chunk = 1
                decoding += 1
            budget -= chunk
            plan.append((r, chunk))
        waiting = self.waiting
        while waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            r = waiting[0]
            if not self._admit(r):
                break
            waiting.popleft()
            self.running.append(r)
            chunk = min(r.target - r.num_computed, budget)
            budget -= chunk
            prefill_tokens += chunk
            plan.append((r, chunk))
        duration = prefill_tokens / cfg.prefill_tokens_per_s
        if prefill_tokens and cfg.prefill_base_ms:
            duration += cfg.prefill_base_ms / 1000.0
        if self._load_tokens:
            duration += self._load_tokens / cfg.cpu_load_tokens_per_s
        if decoding:
            duration += (cfg.itl_base_ms + cfg.itl_slope_ms * len(self.running)) / 1000.0
        return plan, duration

    def _admit(self, r: SimRequest) -> bool:
        """Give ``r`` the blocks for what it must compute now (its prompt, or after a
        preemption its prompt and output so far), reusing the cached prefix."""
        cache = self.cache
        bs = cache.block_size
        resumed = r.num_generated > 0
        tokens = r.all_tokens() if resumed else r.prompt
        hashes = block_hashes(tokens, bs, parent=salt_root(r.cache_salt, r.lora))
        limit = (len(tokens) - 1) // bs
        hits = cache.match(hashes, limit)
        offloaded = cache.cpu_prefix(hashes, len(hits), limit)
        cached = len(hits) + len(offloaded)
        received = int(r.pd.get("received", 0)) if r.pd and not resumed else 0
        computed = max(cached * bs, min(received, len(tokens) - 1))
        need_now = -(-len(tokens) // bs) - len(hits)
        if cache.available(hits) < need_now:
            return False
        cache.acquire(hits)
        loaded = cache.load(offloaded, hashes[len(hits) - 1] if hits else None, r.cache_salt, r.lora)
        r.blocks = hits + loaded + cache.allocate(need_now - len(loaded))
        r.hashes = hashes
        r.committed = cached
        r.target = len(tokens)
        r.num_computed = computed
        metrics = self.metrics
        metrics.prefix_queries += len(tokens)
        metrics.prefix_hits += len(hits) * bs
        if cache.cpu is not None:  # vLLM counts connector (offloaded) hits apart from GPU hits
            metrics.external_queries += len(tokens) - len(hits) * bs
            metrics.external_hits += len(loaded) * bs
            self._load_tokens += len(loaded) * bs
        if not resumed:
            r.num_cached = computed
            self.metrics.prompt_tokens += len(tokens)
        if computed > cached * bs:
            self._commit(r, computed)
        return True

    def _commit(self, r: SimRequest, upto_tokens: int) -> None:
        """Cache the full blocks of ``r`` that are computed up to token ``upto_tokens``."""
        bs = self.cache.block_size
        full = min(upto_tokens // bs, len(r.blocks))
        start = r.committed
        if full <= start:
            return
        tokens = r.prompt if upto_tokens <= len(r.prompt) else r.all_tokens()
        hashes = r.hashes
        while len(hashes) < full:
            i = len(hashes)
            prev = hashes[-1] if hashes else salt_root(r.cache_salt, r.lora)
            hashes.append(chain_hash(prev, tokens[i * bs : (i + 1) * bs]))
        parent = hashes[start - 1] if start else None
        self.cache.commit(
            r.blocks, start, hashes[start:full], parent, tokens[start * bs : full * bs], r.cache_salt, r.lora
        )
        r.committed = full

    def _execute(self, plan: list[tuple[SimRequest, int]], now: float) -> None:
        metrics = self.metrics
        for r, chunk in plan:
            if r.done or not r.blocks:  # finished, aborted or preempted during this step
                continue
            if r.num_computed < r.target:
                r.num_computed += chunk
                self._commit(r, r.num_computed)
                if r.num_computed < r.target:
                    continue
                if r.first_token_at is None:
                    r.first_token_at = now
                    metrics.ttft.observe(now - r.arrival)
                else:  # recomputed after a preemption
                    metrics.itl.observe(now - r.last_token_at)
            else:
                metrics.itl.observe(now - r.last_token_at)
            r.last_token_at = now
            if self._generate(r):
                self._finish(r, now)
            else:
                self._grow(r)
                if r.stream:
                    r.wake.set()

    def _finish(self, r: SimRequest, now: float) -> None:
        """Done: free its blocks at once (a later request of this step may need them)."""
        self.running.remove(r)
        self._release(r)
        r.done = True
        metrics = self.metrics
        metrics.e2e.observe(now - r.arrival)
        reason = r.choices[0].finish_reason or "length"
        metrics.success[reason] = metrics.success.get(reason, 0) + 1
        r.wake.set()

    def _generate(self, r: SimRequest) -> bool:
        """One token for every unfinished choice; True when the request is finished."""
        vocab = self._vocab
        nv = len(vocab)
        decode = self.tokenizer.decode_token
        eos_rate = 0.0 if r.ignore_eos else self.cfg.eos_rate
        all_done = True
        for ci, ch in enumerate(r.choices):
            if ch.finish_reason is not None:
                continue
            x = ch.next_random()
            if eos_rate and len(ch.tokens) >= r.min_tokens and (x & 0xFFFF) < eos_rate * 65536:
                tok = EOS_ID
            else:
                tok = vocab[(x >> 16) % nv]
            ch.push(tok)
            self.metrics.generation_tokens += 1
            if tok == EOS_ID or (tok in r.stop_token_ids and len(ch.tokens) >= r.min_tokens):
                ch.finish_reason = "stop"
                if r.stream:
                    r.output.append((ci, tok, "", "stop"))
                continue
            piece = decode(tok)
            if r.stop and len(ch.tokens) >= r.min_tokens:
                old = len(ch.text)
                text = ch.text + piece
                for s in r.stop:
                    idx = text.find(s, max(0, old - len(s)))
                    if idx >= 0:
                        piece = text[old:idx] if idx > old else ""
                        text = text[:idx]
                        ch.finish_reason = "stop"
                        break
                ch.text = text
            else:
                ch.text += piece
            if ch.finish_reason is None and len(ch.tokens) >= r.max_tokens:
                ch.finish_reason = "length"
            if r.stream:
                r.output.append((ci, tok, piece, ch.finish_reason))
            if ch.finish_reason is None:
                all_done = False
        return all_done

    def _grow(self, r: SimRequest) -> None:
        """Give ``r`` a block for its next token when the last one is full; cache full blocks.

        With no free block, the most recently admitted other request is preempted (its
        blocks freed, recomputed later, as vLLM's recompute preemption); ``r`` itself
        when it is the only candidate. Under ``--scheduling-policy priority`` the running
        request of the largest ``(priority, arrival)``, ``r`` included, as vLLM's scheduler.
        """
        cache = self.cache
        total = len(r.prompt) + r.num_generated
        if total >= len(r.blocks) * cache.block_size:
            by_priority = self.cfg.scheduling_policy == "priority"
            while not cache.free:
                if by_priority:
                    running = self.running  # ties: the later admitted
                    victim = running[
                        max(range(len(running)), key=lambda i: (running[i].priority, running[i].arrival, i))
                    ]
                else:
                    victim = next((v for v in reversed(self.running) if v is not r), r)
                self._preempt(victim)
                if victim is r:
                    return
            r.blocks.extend(cache.allocate(1))
        self._commit(r, total)

    def _preempt(self, r: SimRequest) -> None:
        self.running.remove(r)
        self.cache.release(r.blocks)
        r.blocks = []
        r.hashes = []
        r.committed = 0
        r.num_computed = 0
        if self.cfg.scheduling_policy == "priority":
            self._wait(r)  # by (priority, arrival), as vLLM re-queues a preempted request
        else:
            self.waiting.appendleft(r)
        self.metrics.preemptions += 1

    def _release(self, r: SimRequest) -> None:
        if r.pd is not None and r.pd.get("remote_decode"):
            r.pd["block_ids"] = [b.block_id for b in r.blocks]
        self.cache.release(r.blocks)
        r.blocks = []
        self._work.set()

    def _flush_events(self) -> None:
        events = self.cache.events
        if events:
            self.cache.events = []
            if self.publish is not None:
                try:
                    self.publish(self.now(), events)
                except Exception:  # a publisher failure must not stop the engine
                    log.exception("kv events: publishing a batch failed")

    # -- introspection ---------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + self.held

    def render_metrics(self) -> str:
        return self.metrics.render(self.num_running, self.num_waiting, self.cache.usage)

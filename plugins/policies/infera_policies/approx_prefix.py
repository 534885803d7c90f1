"""``approximate-prefix``: cache affinity without KV events, from the router's own decisions.

For engines that publish no KV events (as sglang-router's ``cache_aware`` policy
does): every routed prompt is cut into fixed-size chunks (characters of the rendered
text, or token ids when the request already has them) whose chained hashes form a
hashed prefix tree — node = hash of the prefix up to that chunk, value = the workers
that were sent that prefix and when. A new prompt scores, per worker, the fraction of
its chunks along the longest prefix that worker was sent. Entries expire after
``ttl_s`` and the tree keeps at most ``max_nodes`` nodes (least recently used go
first), approximating the engine's own eviction.

With ``untokenized_only`` it is the ``kv-aware`` presets' text fallback: requests that
carry token ids (the model has a routing tokenizer) score 0 and are left to
``kv-overlap``; requests without them (no tokenizer for the model, or tokenizing failed)
are routed by their text prefix instead of by load only.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from infera_core.request import RequestContext
from infera_core.scheduling.arrays import Floats
from infera_core.scheduling.config import PluginRef, ProfileConfig, ScorerRef
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.types import Endpoint, PolicyFactory, SchedulerDeps, Scorer

_SEED = 0x5EED_A9F


class ApproxPrefixParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    chunk_chars: int = Field(64, ge=1, description="Characters per tree edge (text prompts).")
    chunk_tokens: int = Field(16, ge=1, description="Token ids per tree edge (token prompts).")
    ttl_s: float = Field(600.0, gt=0, description="Forget a worker's prefix after this many seconds unused.")
    max_nodes: int = Field(200_000, ge=1, description="Most prefix nodes remembered (LRU beyond).")
    untokenized_only: bool = Field(
        False,
        description="Score only requests without token ids (the kv-aware presets' text fallback for "
        "models without a routing tokenizer); requests with token ids score 0.",
    )


def prompt_text(body: dict[str, Any]) -> str:
    """The request's prompt as one string (chat messages role-tagged and joined)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]
    parts: list[str] = []
    system = body.get("system")
    if system is not None:
        parts.append(f"system\x1f{system}\x1e")
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                parts.append(f"{m.get('role', '')}\x1f{m.get('content', '')}\x1e")
    return "".join(parts)


class ApproximatePrefixScorer(Scorer):
    """Fraction of the prompt this server already sent to the worker (prefix tree of past decisions)."""

    name = "approximate-prefix"
    text_fallback = True
    __slots__ = (
        "_clock",
        "_last_key",
        "_last_nodes",
        "chunk_chars",
        "chunk_tokens",
        "max_nodes",
        "nodes",
        "ttl",
        "untokenized_only",
    )

    def __init__(
        self, params: ApproxPrefixParams | None = None, clock: Callable[[], float] | None = None
    ) -> None:
        p = params or ApproxPrefixParams()
        self.chunk_chars = p.chunk_chars
        self.chunk_tokens = p.chunk_tokens
        self.ttl = p.ttl_s
        self.max_nodes = p.max_nodes
        self.untokenized_only = p.untokenized_only
        self._clock = clock or time.monotonic
        self.nodes: OrderedDict[int, dict[str, float]] = OrderedDict()
        """prefix-node hash → {worker_id: last time a prompt through this node went there}."""
        self._last_key: str | None = None
        self._last_nodes: list[int] = []

    def _path(self, ctx: RequestContext) -> list[int]:
        if self.untokenized_only and ctx.token_ids:
            return []
        if self._last_key == ctx.request_id:
            return self._last_nodes
        out: list[int] = []
        h = _SEED
        if ctx.token_ids:
            ids, step = ctx.token_ids, self.chunk_tokens
            for i in range(0, len(ids) - step + 1, step):
                h = hash((h, *ids[i : i + step]))
                out.append(h)
        else:
            text, step = prompt_text(ctx.body), self.chunk_chars
            for i in range(0, len(text) - step + 1, step):
                h = hash((h, text[i : i + step]))
                out.append(h)
        self._last_key = ctx.request_id
        self._last_nodes = out
        return out

    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        path = self._path(ctx)
        if not path:
            return [0.0] * len(candidates)
        oldest = self._clock() - self.ttl
        alive = {ep.worker_id for ep in candidates}
        depth: dict[str, int] = {}
        n = 0
        for node in path:
            holders = self.nodes.get(node)
            if holders is None:
                break
            still = {w for w in alive if holders.get(w, oldest - 1.0) >= oldest}
            for w in alive - still:
                depth[w] = n
            alive = still
            if not alive:
                break
            n += 1
        for w in alive:
            depth[w] = n
        total = len(path)
        return [depth.get(ep.worker_id, 0) / total for ep in candidates]

    def score_rows(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> Floats:
        """:meth:`score` as an array (so the ``kv-aware`` presets keep their array path)."""
        if self.untokenized_only and ctx.token_ids:
            return np.zeros(len(candidates), np.float64)
        return np.asarray(self.score(ctx, candidates), np.float64)

    def on_routed(self, ctx: RequestContext, endpoint: Endpoint) -> None:
        now = self._clock()
        nodes = self.nodes
        worker = endpoint.worker_id
        for node in self._path(ctx):
            holders = nodes.get(node)
            if holders is None:
                nodes[node] = {worker: now}
            else:
                holders[worker] = now
                nodes.move_to_end(node)
        while len(nodes) > self.max_nodes:
            nodes.popitem(last=False)
        # lazily drop expired holders from the oldest nodes
        oldest = now - self.ttl
        for _ in range(min(8, len(nodes))):
            node, holders = next(iter(nodes.items()))
            for w in [w for w, t in holders.items() if t < oldest]:
                del holders[w]
            if holders:
                break
            del nodes[node]


def register_approx_prefix_scorer(registry: PolicyRegistry) -> None:
    """Add the ``approximate-prefix`` scorer (once: the ``kv-aware`` presets use it too)."""
    if "scorer:approximate-prefix" in registry.names():
        return

    def build(p: Any, d: SchedulerDeps) -> Scorer:
        return ApproximatePrefixScorer(p, d.clock)

    registry.add(
        PolicyFactory(
            "approximate-prefix", "scorer", build, ApproxPrefixParams, ApproximatePrefixScorer.__doc__ or ""
        )
    )


def register_approx_prefix(registry: PolicyRegistry) -> None:
    """Add the ``approximate-prefix`` scorer and preset."""
    register_approx_prefix_scorer(registry)
    registry.add_preset(
        "approximate-prefix",
        ProfileConfig(
            filters=[
                PluginRef(name="health"),
                PluginRef(name="role"),
                PluginRef(name="imbalance-guard", params={"factor": 1.5}),
            ],
            scorers=[
                ScorerRef(name="approximate-prefix", weight=1.0),
                ScorerRef(name="load", weight=0.3),
                ScorerRef(name="recent-dispatch", weight=0.1),
            ],
            picker=PluginRef(name="max-score"),
        ),
        "Cache affinity without KV events: a prefix tree of this server's past decisions, with load balance.",
    )

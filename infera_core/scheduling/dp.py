"""DP-attention endpoints: one URL fronting ``dp_size`` ranks, each with its own KV cache.

SGLang with ``--dp-size N --enable-dp-attention`` serves all N ranks behind one HTTP server;
its record has ``dp_size = N`` and no ``dp_rank``, and the KV hub keeps one view per rank
(``(worker_id, r)``: the ranks publish on consecutive ports, or tag each batch with
``dp_rank``). Routing such an endpoint takes two steps, on the mixed path as on the PD path:

* scoring credits the endpoint with its **best rank's** cached prefix
  (:func:`best_rank_overlap`, called by the ``kv-overlap`` scorer), so a prefix cached on
  rank 1 attracts the request to that server;
* once the endpoint is picked, :class:`DpRanks` chooses the rank — the one holding the
  longest cached prefix, else the ranks in turn — and the request carries it in the
  ``X-Data-Parallel-Rank`` header. SGLang reads that header (case-insensitively) in
  ``OpenAIServingBase.extract_routed_dp_rank_from_header``
  (``python/sglang/srt/entrypoints/openai/serving_base.py``); it wins over a body
  ``routed_dp_rank``.

Endpoints whose record carries a ``dp_rank`` (vLLM external-LB DP: one server per rank) are
ordinary endpoints: their view is ``(worker_id, dp_rank)`` and nothing here applies.
"""

from __future__ import annotations

import itertools
from collections.abc import MutableSequence, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infera_core.request import RequestContext
    from infera_core.scheduling.arrays import Floats
    from infera_core.scheduling.types import Endpoint, KvIndexView, KvView

"""The header that steers a request to one DP rank of a DP-attention server."""

DEFAULT_WEIGHTS = (1.0, 0.5, 0.25)


def fronts_ranks(ep: Endpoint) -> bool:
    """True for a DP-attention endpoint: one URL, ``dp_size`` ranks, the rank chosen per request."""
    return ep.dp_rank is None and ep.record.dp_size > 1


def rank_views(index: KvIndexView, ep: Endpoint) -> list[KvView]:
    """The credited views of ``ep``'s ranks (stale and untrusted ones left out), in rank order."""
    if ep.worker_id in index.untrusted:
        return []
    get = index.views_by_key.get
    views = (get((ep.worker_id, r)) for r in range(ep.record.dp_size))
    return [v for v in views if v is not None]


def _best(
    index: KvIndexView, ctx: RequestContext, views: Sequence[KvView], weights: tuple[float, float, float]
) -> tuple[float, int | None]:
    """(fraction of the prompt's blocks cached, rank) of the best view; (0.0, None) when none holds any."""
    best, rank = 0.0, None
    for bs in {v.block_size for v in views}:  # one size per server in practice
        hashes = ctx.cached_block_hashes(bs, index.hash_prompt)
        if not hashes:
            continue
        group = [v for v in views if v.block_size == bs]
        for view, matched in zip(group, index.match(hashes, group, weights), strict=True):
            score = matched / len(hashes)
            if score > best:
                best, rank = score, view.dp_rank
    return best, rank


def best_rank_overlap(
    index: KvIndexView,
    ctx: RequestContext,
    candidates: Sequence[Endpoint],
    weights: tuple[float, float, float],
    scores: MutableSequence[float] | Floats,
) -> None:
    """Set ``scores[i]`` of every DP-attention candidate to its best rank's overlap (in place).

    Costs nothing while no worker has per-rank views (``index.ranked_workers`` is empty)."""
    ranked = index.ranked_workers
    if not ranked or not ctx.token_ids:
        return
    for i, ep in enumerate(candidates):
        if ep.worker_id in ranked and fronts_ranks(ep):
            views = rank_views(index, ep)
            scores[i] = _best(index, ctx, views, weights)[0] if views else 0.0


class DpRanks:
    """Chooses the rank of a picked DP-attention endpoint: the longest cached prefix, else in turn."""

    __slots__ = ("_turn", "index", "weights")

    def __init__(
        self, index: KvIndexView | None = None, weights: tuple[float, float, float] = DEFAULT_WEIGHTS
    ) -> None:
        self.index = index
        self.weights = weights
        self._turn: dict[str, itertools.count[int]] = {}

    def choose(self, ep: Endpoint, ctx: RequestContext | None) -> int | None:
        """The rank to steer to, or None when ``ep`` is not a DP-attention endpoint."""
        size = ep.record.dp_size
        if size <= 1 or ep.dp_rank is not None:
            return None
        index = self.index
        if ctx is not None and ctx.token_ids and index is not None:
            views = rank_views(index, ep)
            if views:
                _, rank = _best(index, ctx, views, self.weights)
                if rank is not None and 0 <= rank < size:
                    return rank
        turn = self._turn.get(ep.worker_id)
        if turn is None:
            turn = self._turn[ep.worker_id] = itertools.count()
        return next(turn) % size

    def forget(self, worker_id: str) -> None:
        self._turn.pop(worker_id, None)

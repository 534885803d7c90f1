"""The router's mirror of every worker's KV cache, and the longest-prefix match.

One :class:`WorkerView` per ``(worker_id, dp_rank)`` with a slot in the block store
(:mod:`infera_core.kv.store`: engine hash → router hash per slot and tier, and per tier
a router hash → bitset of slots, so one request is scored in one pass over its prompt
blocks). The store is the ``infera-kv-native`` C tables when installed, else the
pure-Python specification (:mod:`infera_core.kv.accel`).

Router hashes come from :mod:`infera_core.kv.hashing`: the engine's parent hash is
looked up in the view to continue the chain; an unknown parent is counted, never
guessed. Only full-attention (and MLA) groups are indexed. The total number of
blocks is bounded (``max_blocks``): past it, the largest view loses its oldest entries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import numpy.typing as npt

from infera_core.kv import accel
from infera_core.kv.decode import tokens_from_packed
from infera_core.kv.events import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    BlockStoredRaw,
    IndexBatch,
    plain,
)
from infera_core.kv.hashing import event_root, keyed_chain, root_hash
from infera_core.kv.store import BlockStore
from infera_core.kv.tiers import TIER_CPU as TIER_CPU  # re-exported: index was their home
from infera_core.kv.tiers import TIER_DISK as TIER_DISK
from infera_core.kv.tiers import TIER_GPU as TIER_GPU
from infera_core.kv.tiers import TIER_NAMES, indexed_kind, medium_tier
from infera_core.kv.tiers import TIERS as TIERS
from infera_core.scheduling.types import KvView

log = logging.getLogger("infera.kv.index")

ViewKey = tuple[str, int | None]
ApplyPayload = Callable[[int, bytes, int, set[int]], tuple[int, int, int, int, int, int] | None]
"""A store's native batch ingestion (``infera_kv_native.Index.apply_payload``)."""


class WorkerView:
    """One worker's (one DP rank's) mirrored cache plus its ingestion counters."""

    __slots__ = (
        "_blocks",
        "bad_block_size",
        "block_size",
        "blocks_evicted",
        "dp_rank",
        "events_applied",
        "last_event_ts",
        "last_seq",
        "skipped_groups",
        "slot",
        "stale",
        "unknown_parent",
        "unknown_removed",
        "worker_id",
    )

    def __init__(
        self, worker_id: str, dp_rank: int | None, slot: int, block_size: int, blocks: BlockStore
    ) -> None:
        self.worker_id = worker_id
        self.dp_rank = dp_rank
        self.slot = slot
        self.block_size = block_size
        self._blocks = blocks
        self.skipped_groups: set[int] = set()
        self.events_applied = 0
        self.unknown_parent = 0
        self.unknown_removed = 0
        self.blocks_evicted = 0
        self.bad_block_size = 0
        """Stored events whose block_size disagrees with the worker record's (not indexed)."""
        self.last_event_ts: float | None = None
        self.last_seq: int | None = None
        self.stale = False

    @property
    def key(self) -> ViewKey:
        return (self.worker_id, self.dp_rank)

    @property
    def nblocks(self) -> tuple[int, int, int]:
        """Blocks held per tier (GPU, CPU, disk)."""
        return self._blocks.nblocks(self.slot)

    def block_count(self) -> int:
        return sum(self._blocks.nblocks(self.slot))

    def held(self, tier: int = 0) -> set[int]:
        """The router hashes this view holds on ``tier``."""
        return self._blocks.held(self.slot, tier)

    def summary(self) -> dict[str, object]:
        return {
            "worker_id": self.worker_id,
            "dp_rank": self.dp_rank,
            "block_size": self.block_size,
            "blocks": self.block_count(),
            "blocks_by_tier": dict(zip(TIER_NAMES, self.nblocks, strict=True)),
            "events_applied": self.events_applied,
            "last_event_ts": self.last_event_ts,
            "last_event_age_s": None if self.last_event_ts is None else time.time() - self.last_event_ts,
            "last_seq": self.last_seq,
            "stale": self.stale,
            "unknown_parent": self.unknown_parent,
            "unknown_removed": self.unknown_removed,
            "evicted_for_memory": self.blocks_evicted,
            "block_size_mismatches": self.bad_block_size,
        }


class KvIndex:
    """All workers' views; see the module docstring."""

    __slots__ = (
        "_applies",
        "_apply_payload",
        "_batch_dp_rank",
        "_blocks",
        "_credited",
        "_free_slots",
        "_match_into",
        "_next_slot",
        "_views",
        "_views_by_slot",
        "max_blocks",
        "ranked_workers",
        "routed_at",
        "total_evicted",
        "untrusted",
        "version",
    )

    def __init__(self, max_blocks: int = 4_000_000) -> None:
        self.max_blocks = max_blocks
        self._blocks: BlockStore = accel.ops.new_store()
        self._apply_payload: ApplyPayload | None = getattr(self._blocks, "apply_payload", None)
        self._batch_dp_rank = accel.ops.batch_dp_rank
        self._match_into: Callable[..., None] | None = getattr(self._blocks, "match_into", None)
        self._views: dict[ViewKey, WorkerView] = {}
        self._credited: dict[ViewKey, WorkerView] = {}
        """The views scorers may credit: every view except stale ones (they lost events)."""
        self._views_by_slot: dict[int, WorkerView] = {}
        self._free_slots: list[int] = []
        self._next_slot = 0
        self.total_evicted = 0
        self._applies = 0
        self.routed_at: dict[str, float] = {}
        """worker_id → wall time a KV-scored request was last routed there (silence check)."""
        self.untrusted: set[str] = set()
        """Workers flagged by the agreement check: their views are not credited by scorers."""
        self.version = 0
        """Changes whenever a view is added, dropped, re-sized or (un)credited (scorers cache slots)."""
        self.ranked_workers: set[str] = set()
        """Workers with per-DP-rank views (``dp_rank`` not None): DP-attention servers are scored
        by their best rank (:mod:`infera_core.scheduling.dp`)."""

    # -- views ----------------------------------------------------------------
    def add_view(self, worker_id: str, dp_rank: int | None, block_size: int) -> WorkerView:
        """The view for ``(worker_id, dp_rank)``, created empty if new."""
        view = self._views.get((worker_id, dp_rank))
        if view is not None:
            if view.block_size != block_size:
                self.clear_view(view)
                view.block_size = block_size
                self.version += 1
            return view
        self.version += 1
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            slot = self._next_slot
            self._next_slot += 1
        view = WorkerView(worker_id, dp_rank, slot, block_size, self._blocks)
        self._views[view.key] = view
        if dp_rank is not None:
            self.ranked_workers.add(worker_id)
        if not view.stale:
            self._credited[view.key] = view
        self._views_by_slot[slot] = view
        self.version += 1  # again once done: a scorer on another thread may have read the first
        return view

    def view(self, worker_id: str, dp_rank: int | None = None) -> WorkerView | None:
        return self._views.get((worker_id, dp_rank))

    @property
    def views_by_key(self) -> dict[ViewKey, WorkerView]:
        """``(worker_id, dp_rank)`` → view, read-only (scorers look many up per request).

        Stale views (they lost events: their content may be wrong) are left out, so no
        scorer credits them until they are trusted again."""
        return self._credited

    def set_stale(self, view: WorkerView, stale: bool) -> None:
        """Mark ``view`` stale (not credited by scorers) or trusted again."""
        view.stale = stale
        self.version += 1
        if stale:
            self._credited.pop(view.key, None)
        elif self._views.get(view.key) is view:
            self._credited[view.key] = view
        self.version += 1  # again once done (the hub may ingest on its own thread)

    def views(self) -> list[WorkerView]:
        return list(self._views.values())

    def views_of(self, worker_id: str) -> list[WorkerView]:
        return [v for v in list(self._views.values()) if v.worker_id == worker_id]

    def drop_worker(self, worker_id: str) -> int:
        """Forget every view of ``worker_id``; returns how many were dropped."""
        dropped = self.views_of(worker_id)
        self.version += 1
        self.ranked_workers.discard(worker_id)
        for view in dropped:
            self.clear_view(view)
            del self._views[view.key]
            self._credited.pop(view.key, None)
            del self._views_by_slot[view.slot]
            self._free_slots.append(view.slot)
        self.version += 1  # again once done (the hub may ingest on its own thread)
        return len(dropped)

    def clear_view(self, view: WorkerView) -> None:
        """Empty one view (AllBlocksCleared, or a replay gap we cannot fill)."""
        self._blocks.clear(view.slot)

    @property
    def blocks(self) -> BlockStore:
        """The block tables (read-only use: tests and diagnostics)."""
        return self._blocks

    # -- ingestion --------------------------------------------------------------
    def apply(self, view: WorkerView, batch: IndexBatch, seq: int | None = None) -> int:
        """Apply one decoded batch to ``view``; returns the number of events applied.

        Raises :class:`~infera_core.kv.events.KvDecodeError` when a stored block's packed
        ``token_ids`` are not ints (the events before it stay applied).
        """
        events = batch.events
        skipped = 0  # events not applied: removals in skipped groups, unknown kinds
        removed: list[BlockHash] = []
        medium: str | None = None
        skipped_groups = view.skipped_groups
        for ev in events:
            if type(ev) is BlockRemoved:
                # vLLM sends one BlockRemoved per evicted block: batch consecutive ones
                if skipped_groups and ev.group_idx in skipped_groups:
                    skipped += 1
                    continue
                if removed and ev.medium != medium:
                    self._drop(view, removed, medium)
                    removed = []
                medium = ev.medium
                removed += ev.block_hashes
                continue
            if removed:
                self._drop(view, removed, medium)
                removed = []
            if type(ev) is BlockStoredRaw or type(ev) is BlockStored:
                self._store(view, ev)
            elif type(ev) is AllBlocksCleared:
                self.clear_view(view)
            else:
                skipped += 1
        if removed:
            self._drop(view, removed, medium)
        n = len(events) - skipped
        self._applied(view, n, seq)
        return n

    @property
    def ingests_payloads(self) -> bool:
        """Whether :meth:`apply_payload` can apply msgpack batches without a decoder."""
        return self._apply_payload is not None

    def apply_payload(self, view: WorkerView, payload: bytes, seq: int | None = None) -> int | None:
        """Parse and apply one vLLM-style msgpack batch natively; returns how many events it
        had, or None, having changed nothing, when it needs a Python decoder (unknown event
        tags, non-int token ids…) or the store cannot ingest payloads."""
        fast = self._apply_payload
        if fast is None:
            return None
        out = fast(view.slot, payload, view.block_size, view.skipped_groups)
        if out is None:
            return None
        events, applied, unknown_parent, unknown_removed, bad_bs, bad_bs_value = out
        if not events:
            return 0
        view.unknown_parent += unknown_parent
        view.unknown_removed += unknown_removed
        if bad_bs:
            self._bad_block_size(view, bad_bs_value, bad_bs)
        self._applied(view, applied, seq)
        return events

    def payload_dp_rank(self, payload: bytes) -> int | None:
        """The ``dp_rank`` of a msgpack batch (ValueError when it is not one, or no parser)."""
        if self._batch_dp_rank is None:
            raise ValueError("this index does not parse payloads")
        return self._batch_dp_rank(payload)

    def _applied(self, view: WorkerView, n: int, seq: int | None) -> None:
        view.events_applied += n
        view.last_event_ts = time.time()
        if seq is not None:
            view.last_seq = seq
        self._applies += 1
        if (
            self.max_blocks
            and (self._applies & 63 == 0 or view.block_count() > self.max_blocks)
            and self.block_count() > self.max_blocks
        ):
            self._enforce_bound()

    @staticmethod
    def _bad_block_size(view: WorkerView, block_size: int, events: int = 1) -> None:
        """Stored blocks at another block size than the record's: prompts could never match them."""
        if not view.bad_block_size and block_size == 0:
            log.warning(
                "worker %s: KV events store blocks with no token ids (block_size 0: vLLM's offloading "
                "connector without kv_connector_extra_config.self_describing_kv_events, which Infera "
                "sets when it launches vLLM with --kv-offloading-size); not indexed",
                view.worker_id,
            )
        elif not view.bad_block_size:
            log.warning(
                "worker %s: KV events have block_size %d but its record says %d; not indexed",
                view.worker_id,
                block_size,
                view.block_size,
            )
        view.bad_block_size += events

    def _store(self, view: WorkerView, ev: BlockStored | BlockStoredRaw) -> None:
        if not indexed_kind(ev.kv_cache_spec_kind):
            if ev.group_idx is not None:
                view.skipped_groups.add(ev.group_idx)
            return
        if ev.block_size != view.block_size:
            self._bad_block_size(view, ev.block_size)
            return
        if not plain(ev):
            self._store_keyed(view, ev)
            return
        parent = ev.parent_block_hash
        ph = root_hash(ev.lora_id) if parent is None else self._parent(view, parent)
        if ph is None:
            return
        ops = accel.ops
        toks = ev.token_ids
        if isinstance(toks, list):
            hashes = ops.chain_hashes(toks, ev.block_size, ph)
        else:
            try:
                hashes = ops.chain_hashes_msgpack(toks, ev.block_size, ph)
            except ValueError:  # not plain ints (e.g. EAGLE bigram pairs): the tolerant way
                hashes = ops.chain_hashes(tokens_from_packed(toks), ev.block_size, ph)
        self._blocks.store(view.slot, medium_tier(ev.medium), ev.block_hashes, hashes)

    def _parent(self, view: WorkerView, parent: BlockHash) -> int | None:
        """The router hash of a stored run's parent; None, counted, when the view lacks it."""
        found = self._blocks.lookup(view.slot, parent)
        if found is None:
            view.unknown_parent += 1
        return found

    def _store_keyed(self, view: WorkerView, ev: BlockStored | BlockStoredRaw) -> None:
        """A stored run whose hashes fold in more than its tokens (LoRA, cache salt, multimodal)."""
        parent = ev.parent_block_hash
        ph = event_root(ev) if parent is None else self._parent(view, parent)
        if ph is None:
            return
        toks = ev.token_ids if isinstance(ev.token_ids, list) else tokens_from_packed(ev.token_ids)
        hashes = keyed_chain(toks, ev.block_size, len(ev.block_hashes), ph, ev, parent is None)
        self._blocks.store(view.slot, medium_tier(ev.medium), ev.block_hashes, hashes)

    def _drop(self, view: WorkerView, block_hashes: list[BlockHash], medium: str | None) -> None:
        """Forget ``block_hashes`` held on ``medium``'s tier."""
        view.unknown_removed += self._blocks.remove(view.slot, medium_tier(medium), block_hashes)[1]

    def block_count(self) -> int:
        return sum(v.block_count() for v in list(self._views.values()))  # read from other threads too

    def _enforce_bound(self) -> None:
        """Drop the oldest entries of the largest views until under ``max_blocks``."""
        excess = self.block_count() - self.max_blocks
        while excess > 0 and self._views:
            view = max(self._views.values(), key=WorkerView.block_count)
            take = min(excess, max(1, view.block_count() // 10))
            removed = self._evict_oldest(view, take)
            if not removed:
                break
            excess -= removed
            view.blocks_evicted += removed
            self.total_evicted += removed
        log.warning("KV index over --kv-index-max-blocks=%d: evicted oldest entries", self.max_blocks)

    def _evict_oldest(self, view: WorkerView, count: int) -> int:
        return self._blocks.evict_oldest(view.slot, count)

    # -- scoring ------------------------------------------------------------------
    @staticmethod
    def hash_prompt(token_ids: list[int], block_size: int, root: int | None = None) -> list[int]:
        """Router hashes of a prompt's full blocks, chained from ``root`` (None: the base
        model's unsalted root; else :func:`~infera_core.kv.hashing.namespace_root`)."""
        return accel.ops.chain_hashes(token_ids, block_size, root_hash() if root is None else root)

    def match(
        self,
        hashes: Sequence[int],
        views: Sequence[KvView | None],
        tier_weights: Iterable[float] = (1.0, 0.5, 0.25),
    ) -> list[float]:
        """Tier-weighted length (in blocks) of the cached prefix of ``hashes`` on each view.

        One pass over the prompt's blocks for all views together: ``alive`` is the set of
        views whose prefix still matches; the walk stops when it is empty. A block held on
        a lower tier only counts ``tier_weights[tier]``.
        """
        if type(hashes) is not list:
            hashes = list(hashes)
        w0, w1, w2 = tier_weights
        return self._blocks.match(hashes, [-1 if v is None else v.slot for v in views], (w0, w1, w2))

    def match_slots(
        self, hashes: Sequence[int], slots: npt.NDArray[np.int64], tier_weights: tuple[float, float, float]
    ) -> npt.NDArray[np.float64]:
        """:meth:`match` for an array of view slots (-1: no view), as an array."""
        if type(hashes) is not list:
            hashes = list(hashes)
        fast = self._match_into
        if fast is not None:
            out = np.zeros(len(slots), np.float64)
            fast(hashes, np.ascontiguousarray(slots, np.int64), tier_weights, out)
            return out
        return np.asarray(self._blocks.match(hashes, slots.tolist(), tier_weights), np.float64)

    @staticmethod
    def naive_match(hashes: Sequence[int], held_sets: Sequence[set[int] | None]) -> list[int]:
        """Reference: walk each worker's own block set (``WorkerView.held()``). Tests and benches."""
        out = []
        for held in held_sets:
            n = 0
            if held is not None:
                for h in hashes:
                    if h not in held:
                        break
                    n += 1
            out.append(n)
        return out

    def stats(self) -> dict[str, object]:
        return {
            "views": len(self._views),
            "blocks": self.block_count(),
            "max_blocks": self.max_blocks,
            "evicted_for_memory": self.total_evicted,
            "unique_router_hashes": self._blocks.unique_hashes(),
            "memory_bytes": self._blocks.memory_bytes(),
            "hot_loops": accel.ops.name,
        }

"""The sim's CPU tier: where blocks evicted from the GPU pool go, as with vLLM's KV offloading.

A fixed number of host blocks in LRU order. A GPU block that the GPU pool evicts is
stored here (``BlockStored`` with ``medium="CPU"``, its parent hash and token ids, as vLLM's
``OffloadingConnector`` publishes with ``self_describing_kv_events``); when the tier is
full its least recently used block is dropped (``BlockRemoved`` ``"CPU"``). A request
whose prefix continues here loads those blocks back into GPU blocks: they leave this tier
(``BlockRemoved`` ``"CPU"``) and are stored on the GPU again (``BlockStored`` ``"GPU"``),
and the step that admits the request lasts the transfer time on top of its prefill.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from infera_core.kv.events import BlockRemoved, BlockStored, KvEvent

MEDIUM = "CPU"


class HostEntry:
    """One block held on the CPU tier: what a ``BlockStored`` for it needs."""

    __slots__ = ("parent", "tokens")

    def __init__(self, parent: int | None, tokens: Sequence[int]) -> None:
        self.parent = parent
        self.tokens = tokens


class HostTier:
    """``capacity`` host blocks, LRU; appends its events to the list the GPU cache passes."""

    __slots__ = ("block_size", "capacity", "entries")

    def __init__(self, capacity: int, block_size: int) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self.entries: OrderedDict[int, HostEntry] = OrderedDict()

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self.entries

    def put(self, block_hash: int, parent: int | None, tokens: Sequence[int], events: list[KvEvent]) -> None:
        """Offload one block evicted from the GPU (dropping the LRU one when full)."""
        entries = self.entries
        if block_hash in entries:
            entries.move_to_end(block_hash)
            return
        if len(entries) >= self.capacity:
            victim, _entry = entries.popitem(last=False)
            events.append(BlockRemoved([victim], MEDIUM))
        entries[block_hash] = HostEntry(parent, tokens)
        events.append(BlockStored([block_hash], parent, list(tokens), self.block_size, None, MEDIUM))

    def take(self, hashes: Sequence[int], events: list[KvEvent]) -> list[HostEntry]:
        """Remove ``hashes`` (all held here) to load them onto the GPU."""
        out = [self.entries.pop(h) for h in hashes]
        if hashes:
            events.append(BlockRemoved(list(hashes), MEDIUM))
        return out

    def contents(self) -> set[int]:
        return set(self.entries)

    def clear(self) -> None:
        self.entries.clear()

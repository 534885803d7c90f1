"""The KV index's block tables: which engine blocks each worker slot holds, per tier.

:class:`PyBlockStore` is the specification, in pure Python. The ``infera-kv-native``
extension's ``Index`` implements the same interface in C tables (and adds
``apply_payload``, which ingests a whole msgpack batch without Python objects per event);
tests check both give identical results. :mod:`infera_core.kv.accel` picks one.

Layout (one request is scored in one pass over its prompt blocks):

* per slot and tier (0 GPU, 1 CPU, 2 disk/external): engine hash → router hash, in
  insertion order (eviction takes the oldest); a count of blocks held; and, only for the
  rare router hash held under several engine hashes, the extra copies (``dups``);
* per tier: router hash → bitset (a Python int) of the slots holding it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Protocol

from infera_core.kv.events import BlockHash

TIERS = (0, 1, 2)


class BlockStore(Protocol):
    """What :class:`~infera_core.kv.index.KvIndex` needs from its block tables."""

    def lookup(self, slot: int, block_hash: BlockHash, /) -> int | None:
        """The router hash of an engine block the slot holds on any tier (GPU first)."""
        ...

    def store(self, slot: int, tier: int, block_hashes: Sequence[BlockHash], hashes: Sequence[int], /) -> int:
        """Mirror stored blocks (engine hash → router hash); returns how many became newly held.

        An engine hash already mirrored is left alone; a router hash the slot already holds
        under another engine hash (cache_salt, extra keys…) is counted as a duplicate.
        """
        ...

    def remove(self, slot: int, tier: int, block_hashes: Sequence[BlockHash], /) -> tuple[int, int]:
        """Forget removed blocks; returns (router hashes no longer held, engine hashes unknown)."""
        ...

    def clear(self, slot: int, /) -> None: ...

    def evict_oldest(self, slot: int, count: int, /) -> int:
        """Remove up to ``count`` blocks, oldest first, disk then CPU then GPU; returns how many."""
        ...

    def nblocks(self, slot: int, /) -> tuple[int, int, int]: ...

    def held(self, slot: int, tier: int, /) -> set[int]: ...

    def dump(self, slot: int, tier: int, /) -> tuple[list[tuple[BlockHash, int]], dict[int, int]]:
        """(engine hash, router hash) pairs oldest first, and the duplicate counts (tests)."""
        ...

    def masks(self, tier: int, /) -> dict[int, int]:
        """Router hash → bitset of the slots holding it (tests)."""
        ...

    def match(
        self, hashes: list[int], slots: list[int], weights: tuple[float, float, float], /
    ) -> list[float]:
        """See :meth:`~infera_core.kv.index.KvIndex.match`; a slot of -1 scores 0."""
        ...

    def unique_hashes(self) -> int: ...

    def memory_bytes(self) -> int: ...


class _Slot:
    __slots__ = ("dups", "emap", "nblocks")

    def __init__(self) -> None:
        self.emap: tuple[dict[BlockHash, int], ...] = ({}, {}, {})
        self.dups: tuple[dict[int, int], ...] = ({}, {}, {})
        self.nblocks = [0, 0, 0]


class PyBlockStore:
    """:class:`BlockStore` in dicts; see the module docstring."""

    __slots__ = ("_masks", "_slots")

    def __init__(self) -> None:
        self._masks: tuple[dict[int, int], ...] = ({}, {}, {})
        self._slots: dict[int, _Slot] = {}

    def _slot(self, slot: int) -> _Slot:
        s = self._slots.get(slot)
        if s is None:
            s = self._slots[slot] = _Slot()
        return s

    def lookup(self, slot: int, block_hash: BlockHash, /) -> int | None:
        s = self._slots.get(slot)
        if s is None:
            return None
        e = s.emap
        found = e[0].get(block_hash)
        if found is None:
            found = e[1].get(block_hash)
            if found is None:
                found = e[2].get(block_hash)
        return found

    def store(self, slot: int, tier: int, block_hashes: Sequence[BlockHash], hashes: Sequence[int], /) -> int:
        s = self._slot(slot)
        emap, dups, masks = s.emap[tier], s.dups[tier], self._masks[tier]
        bit = 1 << slot
        added = 0
        for eh, h in zip(block_hashes, hashes, strict=False):
            if emap.setdefault(eh, h) is not h:
                continue  # this engine block is already mirrored
            m = masks.get(h, 0)
            if m & bit:
                dups[h] = dups.get(h, 0) + 1
            else:
                masks[h] = m | bit
                added += 1
        s.nblocks[tier] += added
        return added

    def remove(self, slot: int, tier: int, block_hashes: Sequence[BlockHash], /) -> tuple[int, int]:
        s = self._slots.get(slot)
        if s is None:
            return 0, len(block_hashes)
        emap, dups, masks = s.emap[tier], s.dups[tier], self._masks[tier]
        nbit = ~(1 << slot)
        removed = unknown = 0
        for eh in block_hashes:
            rh = emap.pop(eh, None)
            if rh is None:
                unknown += 1
                continue
            if dups:
                c = dups.get(rh)
                if c is not None:  # another engine hash still holds these tokens
                    if c > 1:
                        dups[rh] = c - 1
                    else:
                        del dups[rh]
                    continue
            m = masks.get(rh)
            if m is None:
                continue
            m &= nbit
            if m:
                masks[rh] = m
            else:
                del masks[rh]
            removed += 1
        s.nblocks[tier] -= removed
        return removed, unknown

    def clear(self, slot: int, /) -> None:
        s = self._slots.pop(slot, None)
        if s is None:
            return
        nbit = ~(1 << slot)
        for tier in TIERS:
            masks = self._masks[tier]
            for rh in s.emap[tier].values():
                m = masks.get(rh, 0) & nbit
                if m:
                    masks[rh] = m
                else:
                    masks.pop(rh, None)

    def evict_oldest(self, slot: int, count: int, /) -> int:
        s = self._slots.get(slot)
        removed = 0
        for tier in (2, 1, 0):
            if s is None or removed >= count:
                break
            victims: list[BlockHash] = []
            for eh in s.emap[tier]:
                if removed + len(victims) >= count:
                    break
                victims.append(eh)
            if victims:
                removed += self.remove(slot, tier, victims)[0]
        return removed

    def nblocks(self, slot: int, /) -> tuple[int, int, int]:
        s = self._slots.get(slot)
        if s is None:
            return (0, 0, 0)
        n = s.nblocks
        return (n[0], n[1], n[2])

    def held(self, slot: int, tier: int, /) -> set[int]:
        s = self._slots.get(slot)
        return set() if s is None else set(s.emap[tier].values())

    def dump(self, slot: int, tier: int, /) -> tuple[list[tuple[BlockHash, int]], dict[int, int]]:
        s = self._slots.get(slot)
        return ([], {}) if s is None else (list(s.emap[tier].items()), dict(s.dups[tier]))

    def masks(self, tier: int, /) -> dict[int, int]:
        return dict(self._masks[tier])

    def match(
        self, hashes: list[int], slots: list[int], weights: tuple[float, float, float], /
    ) -> list[float]:
        bit_index: dict[int, int] = {}
        alive = 0
        for i, slot in enumerate(slots):
            if slot >= 0:
                bit = 1 << slot
                bit_index[bit] = i
                alive |= bit
        out = [0.0] * len(slots)
        if not alive or not hashes:
            return out
        g, c, d = self._masks
        lower = bool(c) or bool(d)
        depth_of: dict[int, int] = {}
        credit: dict[int, float] = {}
        w0, w1, w2 = weights
        depth = 0
        for h in hashes:
            gm = g.get(h, 0)
            if lower:
                cm = c.get(h, 0) & ~gm
                dm = d.get(h, 0) & ~gm & ~cm
                m = (gm | cm | dm) & alive
                low = (cm | dm) & m
                while low:
                    b = low & -low
                    credit[b] = credit.get(b, 0.0) + (w0 - (w1 if cm & b else w2))
                    low ^= b
            else:
                m = gm & alive
            if m != alive:
                if depth:  # views dropped at depth 0 keep the default 0: no per-view work
                    dropped = alive & ~m
                    while dropped:
                        b = dropped & -dropped
                        depth_of[b] = depth
                        dropped ^= b
                alive = m
                if not alive:
                    break
            depth += 1
        while alive:
            b = alive & -alive
            depth_of[b] = depth
            alive ^= b
        for b, blocks in depth_of.items():
            out[bit_index[b]] = blocks * w0
        for b, lower_tiers in credit.items():
            out[bit_index[b]] -= lower_tiers
        return out

    def unique_hashes(self) -> int:
        return sum(len(m) for m in self._masks)

    def memory_bytes(self) -> int:
        """The dicts' own sizes (the int objects they point at are not counted)."""
        size = sys.getsizeof
        total = sum(size(m) for m in self._masks)
        for s in self._slots.values():
            total += sum(size(e) for e in s.emap) + sum(size(d) for d in s.dups)
        return total

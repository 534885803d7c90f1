"""The sim's KV cache: a fixed pool of blocks with vLLM-style prefix caching.

* Only full blocks are cached. A block's hash chains from its parent's hash and its
  token ids (blake2b → unsigned 64 bits), so equal prefixes give equal hashes.
* Blocks referenced by a running request are never evicted. Unreferenced cached
  blocks sit in an LRU free queue; a request frees its blocks tail first, so leaves
  are evicted before their parents (as vLLM does).
* Every change a subscriber must see is appended to :attr:`KvCache.events` as a
  normalized event (``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``); the
  engine publishes them once per step.
* With a CPU tier (``cpu_blocks`` > 0, :mod:`infera_sim.offload`) an evicted block moves
  there instead of vanishing, and :meth:`KvCache.load` brings blocks back.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from infera_core.kv.events import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KvEvent
from infera_sim.offload import HostTier

_MASK64 = (1 << 64) - 1
_blake2b = hashlib.blake2b


def chain_hash(parent: int | None, token_ids: Sequence[int]) -> int:
    """Hash of one full block: blake2b(parent u64 ‖ token ids as u32) → low 64 bits."""
    data = (parent if parent is not None else _MASK64).to_bytes(8, "little") + array("I", token_ids).tobytes()
    return int.from_bytes(_blake2b(data, digest_size=8).digest(), "little")


def salt_root(salt: str | None) -> int | None:
    """The parent hash a salted prompt's first block chains from (None: unsalted)."""
    if salt is None:
        return None
    return int.from_bytes(_blake2b(b"cache_salt\0" + salt.encode(), digest_size=8).digest(), "little")


def block_hashes(
    token_ids: Sequence[int], block_size: int, start: int = 0, parent: int | None = None
) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` from block index ``start``."""
    out: list[int] = []
    raw = array("I", token_ids).tobytes()
    step = 4 * block_size
    prev = (parent if parent is not None else _MASK64).to_bytes(8, "little")
    for i in range(start, len(token_ids) // block_size):
        prev = _blake2b(prev + raw[i * step : (i + 1) * step], digest_size=8).digest()
        out.append(int.from_bytes(prev, "little"))
    return out


class Block:
    """One physical KV block."""

    __slots__ = ("block_id", "hash", "parent", "ref", "tokens")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.hash: int | None = None
        self.ref = 0
        self.parent: int | None = None
        """Parent hash and token ids: kept only with a CPU tier (what offloading publishes)."""
        self.tokens: Sequence[int] = ()


class KvCache:
    """A block pool with prefix caching and LRU eviction; collects events in :attr:`events`."""

    __slots__ = ("block_size", "blocks", "cached", "cpu", "events", "free", "medium", "num_blocks")

    def __init__(
        self, num_blocks: int, block_size: int = 16, medium: str = "GPU", cpu_blocks: int = 0
    ) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.medium = medium
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        """Unreferenced blocks, eviction order first (uncached ones at the front)."""
        self.cached: dict[int, Block] = {}
        self.events: list[KvEvent] = []
        self.cpu = HostTier(cpu_blocks, block_size) if cpu_blocks > 0 else None
        """The CPU tier blocks evicted from this pool move to (None: evicted blocks are lost)."""

    # -- queries -------------------------------------------------------------------------
    def match(self, hashes: Sequence[int], max_blocks: int) -> list[Block]:
        """The longest cached prefix of ``hashes`` (at most ``max_blocks`` blocks)."""
        out: list[Block] = []
        cached = self.cached
        for h in hashes[:max_blocks]:
            block = cached.get(h)
            if block is None:
                break
            out.append(block)
        return out

    def cpu_prefix(self, hashes: Sequence[int], start: int, stop: int) -> list[int]:
        """The run of ``hashes[start:stop]`` held on the CPU tier and not on the GPU."""
        out: list[int] = []
        cpu, cached = self.cpu, self.cached
        if cpu is None:
            return out
        for h in hashes[start:stop]:
            if h in cached or h not in cpu:
                break
            out.append(h)
        return out

    def available(self, hits: Sequence[Block] = ()) -> int:
        """Blocks a new request could still get, if it takes ``hits`` from the free queue."""
        in_free = sum(1 for b in hits if b.ref == 0)
        return len(self.free) - in_free

    @property
    def used(self) -> int:
        return self.num_blocks - len(self.free)

    @property
    def usage(self) -> float:
        return self.used / self.num_blocks

    def contents(self) -> set[int]:
        """Hashes of every cached block (what a subscriber of the events should hold)."""
        return set(self.cached)

    # -- mutations -----------------------------------------------------------------------
    def acquire(self, blocks: Sequence[Block]) -> None:
        """Reference cached blocks (a prefix hit): they leave the free queue."""
        for b in blocks:
            if b.ref == 0:
                del self.free[b.block_id]
            b.ref += 1

    def allocate(self, n: int) -> list[Block]:
        """Take ``n`` blocks from the free queue, evicting cached ones (events emitted)."""
        out: list[Block] = []
        free = self.free
        for _ in range(n):
            block_id, _none = free.popitem(last=False)
            block = self.blocks[block_id]
            if block.hash is not None:
                del self.cached[block.hash]
                self.events.append(BlockRemoved([block.hash], self.medium))
                if self.cpu is not None:
                    self.cpu.put(block.hash, block.parent, block.tokens, self.events)
                block.hash = None
            block.ref = 1
            out.append(block)
        return out

    def commit(
        self,
        blocks: list[Block],
        start: int,
        hashes: Sequence[int],
        parent: int | None,
        token_ids: Sequence[int],
        salt: str | None = None,
    ) -> None:
        """Cache ``blocks[start : start + len(hashes)]``, now full: one ``BlockStored`` per run.

        ``token_ids`` are the tokens of exactly those blocks; ``parent`` is the hash of the
        block before the first one (None at the start of a sequence, whose first block's
        ``extra_keys`` then carry ``salt``, as vLLM's events do). A block whose hash
        is already cached (computed twice concurrently) is swapped for the cached copy,
        which the request then holds, so its chain of cached parents stays intact.
        """
        bs = self.block_size
        run: list[BlockHash] = []
        run_start = 0
        run_parent = parent
        prev = parent
        for i, h in enumerate(hashes):
            existing = self.cached.get(h)
            if existing is not None:
                self._flush(run, run_parent, token_ids[run_start * bs : (run_start + len(run)) * bs], salt)
                run = []
                own = blocks[start + i]
                if existing is not own:
                    self.acquire((existing,))
                    blocks[start + i] = existing
                    self.release((own,))
                prev = h
                continue
            if not run:
                run_start, run_parent = i, prev
            block = blocks[start + i]
            block.hash = h
            if self.cpu is not None:
                block.parent = prev
                block.tokens = token_ids[i * bs : (i + 1) * bs]
            self.cached[h] = block
            run.append(h)
            prev = h
        self._flush(run, run_parent, token_ids[run_start * bs : (run_start + len(run)) * bs], salt)

    def load(self, hashes: Sequence[int], parent: int | None, salt: str | None = None) -> list[Block]:
        """Load blocks held on the CPU tier (a run following ``parent``) into new GPU blocks.

        They leave the CPU tier first, so the GPU evictions this allocation causes cannot
        drop them; then one ``BlockStored`` on the GPU for the run. Returns the blocks
        (referenced once, as :meth:`allocate` does).
        """
        cpu = self.cpu
        if cpu is None or not hashes:
            return []
        entries = cpu.take(hashes, self.events)
        blocks = self.allocate(len(hashes))
        tokens: list[int] = []
        prev = parent
        for block, h, entry in zip(blocks, hashes, entries, strict=True):
            block.hash = h
            block.parent = prev
            block.tokens = entry.tokens
            self.cached[h] = block
            tokens.extend(entry.tokens)
            prev = h
        self._flush(list(hashes), parent, tokens, salt)
        return blocks

    def _flush(
        self, run: list[BlockHash], parent: int | None, token_ids: Sequence[int], salt: str | None = None
    ) -> None:
        if run:
            event = BlockStored(run, parent, list(token_ids), self.block_size, None, self.medium)
            if salt is not None and parent is None:
                event.extra_keys = [[salt]] + [None] * (len(run) - 1)
            self.events.append(event)

    def release(self, blocks: Sequence[Block]) -> None:
        """Drop one reference of each block, tail first; unreferenced ones become evictable."""
        free = self.free
        for b in reversed(blocks):
            b.ref -= 1
            if b.ref == 0:
                free[b.block_id] = None
                if b.hash is None:
                    free.move_to_end(b.block_id, last=False)

    def reset(self) -> bool:
        """Forget every cached block (like vLLM, refused while requests hold blocks)."""
        if len(self.free) != self.num_blocks:
            return False
        for block in self.cached.values():
            block.hash = None
        self.cached.clear()
        if self.cpu is not None:
            self.cpu.clear()
        self.events.append(AllBlocksCleared())
        return True

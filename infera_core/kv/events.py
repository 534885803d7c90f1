"""Normalized KV cache events (engine-independent) and the decoder contract.

Decoders (registered through ``infera_register_kv_event_decoders``) turn one
publisher payload into a :class:`KvEventBatch`. Block hashes are normalized to
unsigned 64-bit ints (or kept as ``bytes`` for engines that send digests); the
router never needs to reproduce an engine's hash function because it re-hashes
``token_ids`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

BlockHash = int | bytes


@dataclass(slots=True)
class BlockStored:
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    kv_cache_spec_kind: str | None = None
    """Attention kind of the KV group (``full_attention``, ``mamba``…); None = full."""
    group_idx: int | None = None


@dataclass(slots=True)
class BlockRemoved:
    block_hashes: list[BlockHash]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(slots=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(slots=True)
class KvEventBatch:
    """One publisher payload: ``[ts, events, dp_rank]``."""

    ts: float
    events: list[KvEvent] = field(default_factory=list)
    dp_rank: int | None = None


class KvDecodeError(ValueError):
    """A payload could not be decoded (counted and logged by the event hub)."""


@runtime_checkable
class KvEventDecoder(Protocol):
    @property
    def name(self) -> str:
        """Matches ``kv_events.format`` in worker records."""
        ...

    def decode(self, payload: bytes) -> KvEventBatch:
        """Decode one msgpack payload; raise :class:`KvDecodeError` when it is not valid."""
        ...

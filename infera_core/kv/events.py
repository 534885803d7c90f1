"""Normalized KV cache events (engine-independent) and the decoder contract.

Decoders (registered through ``infera_register_kv_event_decoders``) turn one
publisher payload into a :class:`KvEventBatch`. Block hashes are normalized to
unsigned 64-bit ints (or kept as ``bytes`` for engines that send digests); the
router never needs to reproduce an engine's hash function because it re-hashes
``token_ids`` itself.

The event types are ``msgspec.Struct`` classes tagged by class name in the field
``type``, so the vLLM ≥0.24 map layout decodes straight into them (unknown fields are
ignored) with no per-event conversion. The fields that change what a block's hash means are
kept: ``lora_name``, ``extra_keys`` (vLLM: per block, the LoRA name, multimodal items, the
``cache_salt``…) and SGLang's ``cache_salt`` (``BlockStoredWithMetadata``'s ``metadata``);
the index gives salted, LoRA and multimodal blocks their own chains
(:mod:`infera_core.kv.hashing`).
They construct like the dataclasses they replaced (same field order and defaults).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import msgspec

from infera_core.registry import Registry

BlockHash = int | bytes


class BlockStored(msgspec.Struct, tag=True, tag_field="type", gc=False):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    kv_cache_spec_kind: str | None = None
    """Attention kind of the KV group (``full_attention``, ``mamba``…); None = full."""
    group_idx: int | None = None
    lora_name: str | None = None
    """The LoRA adapter's name (vLLM; SGLang): the chain's namespace, with the salt."""
    extra_keys: list[Any] | None = None
    """Per block, what the engine hashed besides the tokens (vLLM's untagged ``extra_keys``)."""
    cache_salt: str | None = None
    """The request's ``cache_salt`` when the engine sends it as a field of its own."""
    metadata: dict[str, Any] | None = None
    """SGLang's ``BlockStoredWithMetadata.metadata`` (``{"cache_salt": …}``)."""


class BlockStoredRaw(msgspec.Struct, tag="BlockStored", tag_field="type", gc=False):
    """:class:`BlockStored` as the index ingests it: ``token_ids`` left as the raw msgpack
    array, hashed without creating a Python int per token (see ``kv.hashing``)."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: msgspec.Raw
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    kv_cache_spec_kind: str | None = None
    group_idx: int | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    cache_salt: str | None = None
    metadata: dict[str, Any] | None = None


def plain(ev: BlockStored | BlockStoredRaw) -> bool:
    """True when nothing but the token ids (and ``lora_id``) went into the block hashes."""
    extra = ev.extra_keys
    return (
        ev.lora_name is None
        and ev.cache_salt is None
        and ev.metadata is None
        and (extra is None or not any(k is not None for k in extra))
    )


def event_salt(ev: BlockStored | BlockStoredRaw) -> str | None:
    """The event's own cache salt (SGLang: a field, or ``metadata``), when it names one."""
    if ev.cache_salt is not None:
        return ev.cache_salt
    md = ev.metadata
    salt = md.get("cache_salt") if md is not None else None
    return salt if isinstance(salt, str) else None


class BlockRemoved(msgspec.Struct, tag=True, tag_field="type", gc=False):
    block_hashes: list[BlockHash]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, tag_field="type", gc=False):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KvEventBatch(msgspec.Struct, array_like=True, gc=False):
    """One publisher payload: ``[ts, events, dp_rank]``."""

    ts: float
    events: list[KvEvent] = msgspec.field(default_factory=list)
    dp_rank: int | None = None


class RawKvEventBatch(msgspec.Struct, array_like=True, gc=False):
    """:class:`KvEventBatch` with stored blocks as :class:`BlockStoredRaw` (the ingest path)."""

    ts: float
    events: list[BlockStoredRaw | BlockRemoved | AllBlocksCleared] = msgspec.field(default_factory=list)
    dp_rank: int | None = None


IndexBatch = KvEventBatch | RawKvEventBatch
"""What :meth:`infera_core.kv.index.KvIndex.apply` takes."""


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


@runtime_checkable
class RawKvEventDecoder(KvEventDecoder, Protocol):
    """A decoder that can also leave token ids packed for the index (the event hub prefers it)."""

    def decode_raw(self, payload: bytes) -> IndexBatch:
        """Like ``decode``; stored blocks may come back as :class:`BlockStoredRaw`."""
        ...


class KvDecoderRegistry(Registry[KvEventDecoder]):
    kind = "KV event decoder"
    protocol = KvEventDecoder


SEQ_BYTES = 8
"""A publisher's sequence number on the wire: 8 bytes, big-endian, signed (a replay ends with -1)."""


def parse_seq(frame: bytes) -> int | None:
    """The seq of a frame: None unless exactly 8 bytes (an 11-byte frame is not a huge seq).

    The value is signed: the replay end marker is -1; callers reject other negatives."""
    if len(frame) != SEQ_BYTES:
        return None
    return int.from_bytes(frame, "big", signed=True)

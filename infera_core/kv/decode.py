"""A generic decoder for vLLM-style KV event payloads (vLLM, SGLang and their kin).

Payload: msgpack ``[ts, events, dp_rank]``. Events come in two layouts:

* map, tagged by ``"type"`` (vLLM ≥ 0.24, SGLang 0.5.23) — decoded straight into the
  normalized :mod:`infera_core.kv.events` structs by msgspec (fast path);
* array, tagged by the first element (older vLLM/SGLang):
  ``["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium, …]``.

For the index, :meth:`MsgpackEventDecoder.decode_raw` leaves each stored block's
``token_ids`` packed (:class:`~infera_core.kv.events.BlockStoredRaw`): the index hashes
them natively; :func:`tokens_from_packed` is the tolerant way back to a list.

Anything the fast path rejects goes through a tolerant slow path that also
normalizes signed int64 hashes to u64 and takes the first id of EAGLE bigram token
pairs. Both keep the fields that change what a block hash means: ``lora_name``,
``extra_keys`` (vLLM: per block, the LoRA name, ``(mm hash, offset)`` pairs, the
``cache_salt``, prompt-embedding digests), SGLang's ``cache_salt`` — as its
``BlockStoredWithMetadata``'s ``metadata`` map (map layout, or the array's 8th item in
SGLang releases before the positional tail, its 15th after), or as a flat field — and
ignore the rest (``session_id``, ``locality``…).
"""

from __future__ import annotations

from typing import Any

import msgspec

from infera_core.kv.events import SEQ_BYTES as SEQ_BYTES  # re-exported: kv.decode was their home
from infera_core.kv.events import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    BlockStoredRaw,
    IndexBatch,
    KvDecodeError,
    KvEvent,
    KvEventBatch,
    RawKvEventBatch,
)
from infera_core.kv.events import parse_seq as parse_seq

_U64 = (1 << 64) - 1


class _LooseBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Any]
    dp_rank: int | None = None


def _norm_hash(h: Any) -> BlockHash:
    if isinstance(h, int) and not isinstance(h, bool):
        return h & _U64 if h < 0 else h
    if isinstance(h, bytes):
        return h
    if isinstance(h, list | tuple) and h and isinstance(h[0], int):
        # some engines send a hash as a small int array; fold it into bytes
        return bytes(x & 0xFF for x in h)
    raise KvDecodeError(f"block hash of type {type(h).__name__} is not an int or bytes")


def _norm_hashes(hashes: Any) -> list[BlockHash]:
    if not isinstance(hashes, list):
        raise KvDecodeError("block_hashes is not a list")
    return [_norm_hash(h) for h in hashes]


def _norm_tokens(tokens: Any) -> list[int]:
    if not isinstance(tokens, list):
        raise KvDecodeError("token_ids is not a list")
    if tokens and not isinstance(tokens[0], int):
        # EAGLE/MTP bigram pairs: [[t0, t1], [t1, t2], …] → first of each
        return [int(t[0]) for t in tokens]
    return tokens


def _opt_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _opt_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _opt_list(v: Any) -> list[Any] | None:
    return v if isinstance(v, list) else None


def _opt_map(v: Any) -> dict[str, Any] | None:
    return v if isinstance(v, dict) else None


def _from_map(ev: dict[str, Any]) -> KvEvent | None:
    kind = ev.get("type")
    if kind == "BlockStored":
        parent = ev.get("parent_block_hash")
        bs = ev.get("block_size")
        if not isinstance(bs, int):
            raise KvDecodeError("BlockStored without an int block_size")
        return BlockStored(
            _norm_hashes(ev.get("block_hashes")),
            None if parent is None else _norm_hash(parent),
            _norm_tokens(ev.get("token_ids")),
            bs,
            _opt_int(ev.get("lora_id")),
            _opt_str(ev.get("medium")),
            _opt_str(ev.get("kv_cache_spec_kind")),
            _opt_int(ev.get("group_idx")),
            _opt_str(ev.get("lora_name")),
            _opt_list(ev.get("extra_keys")),
            _opt_str(ev.get("cache_salt")),
            _opt_map(ev.get("metadata")),
        )
    if kind == "BlockRemoved":
        return BlockRemoved(
            _norm_hashes(ev.get("block_hashes")), _opt_str(ev.get("medium")), _opt_int(ev.get("group_idx"))
        )
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _from_array(ev: list[Any]) -> KvEvent | None:
    kind = ev[0] if ev else None
    if kind == "BlockStored":
        if len(ev) < 5 or not isinstance(ev[4], int):
            raise KvDecodeError("array BlockStored needs [tag, hashes, parent, token_ids, block_size, …]")
        parent = ev[2]
        # vLLM's positional tail: lora_name, extra_keys, … (SGLang; the native parser reads the
        # same items); SGLang's metadata map is the 8th item before that tail, the 15th after it
        at = [ev[i] if len(ev) > i else None for i in range(15)]
        return BlockStored(
            _norm_hashes(ev[1]),
            None if parent is None else _norm_hash(parent),
            _norm_tokens(ev[3]),
            ev[4],
            _opt_int(at[5]),
            _opt_str(at[6]),
            None,
            None,
            _opt_str(at[7]),
            _opt_list(at[8]),
            None,
            _opt_map(at[7]) or _opt_map(at[14]),
        )
    if kind == "BlockRemoved":
        if len(ev) < 2:
            raise KvDecodeError("array BlockRemoved needs [tag, hashes, …]")
        return BlockRemoved(_norm_hashes(ev[1]), _opt_str(ev[2]) if len(ev) > 2 else None)
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def tokens_from_packed(packed: msgspec.Raw) -> list[int]:
    """The token ids of a :class:`BlockStoredRaw`, normalized like the slow path (bigrams…)."""
    try:
        return _norm_tokens(msgspec.msgpack.decode(packed))
    except msgspec.DecodeError as exc:
        raise KvDecodeError(f"token_ids: {exc}") from None
    except (TypeError, ValueError, IndexError) as exc:
        raise KvDecodeError(f"malformed token_ids: {exc}") from None


class MsgpackEventDecoder:
    """Decodes vLLM-style payloads (both layouts). ``unknown_events`` counts skipped events."""

    __slots__ = ("_fast", "_loose", "_raw", "name", "signed_hashes", "slow_batches", "unknown_events")

    def __init__(self, name: str = "vllm", signed_hashes: bool = False) -> None:
        self.name = name
        self.signed_hashes = signed_hashes
        """True when the engine may send int64 hashes (SGLang): negatives become u64."""
        self._fast = msgspec.msgpack.Decoder(KvEventBatch)
        self._loose = msgspec.msgpack.Decoder(_LooseBatch)
        self._raw = msgspec.msgpack.Decoder(RawKvEventBatch)
        self.unknown_events = 0
        self.slow_batches = 0

    def decode(self, payload: bytes) -> KvEventBatch:
        try:
            batch = self._fast.decode(payload)
        except msgspec.DecodeError:
            return self._decode_slow(payload)
        if self.signed_hashes:
            _fix_signed(batch)
        return batch

    def decode_raw(self, payload: bytes) -> IndexBatch:
        """Like :meth:`decode`, leaving stored token ids packed (what the event hub ingests)."""
        try:
            batch = self._raw.decode(payload)
        except msgspec.DecodeError:
            return self._decode_slow(payload)
        if self.signed_hashes:
            _fix_signed(batch)
        return batch

    def _decode_slow(self, payload: bytes) -> KvEventBatch:
        try:
            loose = self._loose.decode(payload)
        except msgspec.DecodeError as exc:
            raise KvDecodeError(f"not a KV event batch: {exc}") from None
        self.slow_batches += 1
        events: list[KvEvent] = []
        for raw in loose.events:
            try:
                if isinstance(raw, dict):
                    ev = _from_map(raw)
                elif isinstance(raw, list):
                    ev = _from_array(raw)
                else:
                    ev = None
            except (TypeError, ValueError, IndexError) as exc:
                if isinstance(exc, KvDecodeError):
                    raise
                raise KvDecodeError(f"malformed event: {exc}") from None
            if ev is None:
                self.unknown_events += 1
            else:
                events.append(ev)
        return KvEventBatch(loose.ts, events, loose.dp_rank)


def _fix_signed(batch: IndexBatch) -> None:
    for ev in batch.events:
        if isinstance(ev, BlockStored | BlockStoredRaw):
            ev.block_hashes = [h & _U64 if isinstance(h, int) and h < 0 else h for h in ev.block_hashes]
            p = ev.parent_block_hash
            if isinstance(p, int) and p < 0:
                ev.parent_block_hash = p & _U64
        elif isinstance(ev, BlockRemoved):
            ev.block_hashes = [h & _U64 if isinstance(h, int) and h < 0 else h for h in ev.block_hashes]

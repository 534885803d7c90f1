"""TensorRT-LLM KV cache events (``kv_events.format = "trtllm"``).

``trtllm-serve`` does not push KV events: ``POST /kv_cache_events``
(``tensorrt_llm/serve/openai_server.py``) returns, and removes from the engine's queue, a
JSON list of the events since the last call (the LLM API's ``get_kv_cache_events_async``).
The worker's launcher polls it (:class:`~infera_core.engines.base.KvEventPoller`) and
publishes each non-empty list as one batch; this decoder reads that list.

Each event is what ``KVCacheEventSerializer`` (``tensorrt_llm/_utils.py``) writes::

    {"event_id": 7, "window_size": 4096, ["attention_dp_rank": 0,]
     "data": {"type": "stored", "parent_hash": null | <u64>,
              "blocks": [{"type": "stored_block", "block_hash": <u64>,
                          "tokens": [{"type": "unique_token", "token_id": 1, "token_extra_id": 0}, …],
                          "cache_level": 0, "priority": 35}, …]}}
    {"data": {"type": "removed", "block_hashes": [<u64>, …]}, …}
    {"data": {"type": "created", "num_blocks_per_cache_level": [N, M]}, …}
    {"data": {"type": "updated", "block_hash": <u64>, "cache_level": {"type": "event_diff",
              "new_value": 1, "old_value": 0}, "priority": {…}}, …}

Normalized: ``stored`` → one :class:`BlockStored` per run of full blocks (``tokens_per_block``
tokens each; a shorter last block is not a reusable prefix for the router and is left out),
``cache_level`` 0 → medium ``GPU``, 1 → ``CPU`` (TRT-LLM's secondary, host memory);
``removed`` → :class:`BlockRemoved`; ``created`` (a new KV cache: nothing cached yet) →
:class:`AllBlocksCleared`; ``updated`` (a block moved between levels or changed priority)
carries no change of what is cached and is skipped. A block whose tokens carry a
``token_extra_id`` (multimodal / prompt-table content the token ids do not show) is not
reproducible from token ids, so it and the blocks chained after it in that event are left
out rather than credited to text prompts. ``lora_id`` is read when present (the serializer
leaves it out today). Hashes are TRT-LLM's ``size_t`` block hashes (u64).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from infera_core.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvDecodeError,
    KvEvent,
    KvEventBatch,
)

FORMAT = "trtllm"
U64 = (1 << 64) - 1
MEDIUM = {0: "GPU", 1: "CPU"}


def _hash(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise KvDecodeError(f"trtllm: block hash {value!r} is not an integer")
    return value & U64


def _stored(data: dict[str, Any]) -> list[KvEvent]:
    parent = data.get("parent_hash")
    parent_hash = None if parent is None else _hash(parent)
    blocks = data.get("blocks")
    if not isinstance(blocks, list):
        raise KvDecodeError("trtllm: stored event without a blocks list")
    out: list[KvEvent] = []
    run: list[tuple[int, list[int]]] = []
    size = 0
    level: Any = None
    lora: Any = None

    def flush() -> None:
        if run:
            tokens = [t for _, block_tokens in run for t in block_tokens]
            out.append(BlockStored([h for h, _ in run], run_parent, tokens, size, lora, MEDIUM.get(level)))

    run_parent = parent_hash
    for block in blocks:
        if not isinstance(block, dict):
            raise KvDecodeError("trtllm: a stored block is not an object")
        block_hash = _hash(block.get("block_hash"))
        raw_tokens = block.get("tokens")
        if not isinstance(raw_tokens, list):
            raise KvDecodeError("trtllm: a stored block without tokens")
        if any(isinstance(t, dict) and t.get("token_extra_id") for t in raw_tokens):
            break  # content the token ids do not show: not this block, nor its children
        try:
            tokens = [int(t["token_id"]) for t in raw_tokens]
        except (TypeError, KeyError, ValueError) as exc:
            raise KvDecodeError(f"trtllm: bad token in a stored block: {exc}") from None
        if not size:
            size = len(tokens)
            level, lora = block.get("cache_level"), block.get("lora_id")
        if not tokens or len(tokens) != size:
            break  # a partial block ends the reusable prefix
        if block.get("cache_level") != level or block.get("lora_id") != lora:
            flush()
            run_parent = run[-1][0] if run else run_parent
            run = []
            level, lora = block.get("cache_level"), block.get("lora_id")
        run.append((block_hash, tokens))
    flush()
    return out


def decode_events(raw: Any) -> KvEventBatch:
    """The normalized batch of one list of serialized TRT-LLM events."""
    if not isinstance(raw, list):
        raise KvDecodeError("trtllm: a KV event batch must be a JSON list of events")
    events: list[KvEvent] = []
    ranks: set[int] = set()
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("data"), dict):
            raise KvDecodeError("trtllm: an event without its data object")
        rank = item.get("attention_dp_rank")
        if isinstance(rank, int):
            ranks.add(rank)
        data = item["data"]
        kind = data.get("type")
        if kind == "stored":
            events += _stored(data)
        elif kind == "removed":
            hashes = data.get("block_hashes")
            if not isinstance(hashes, list):
                raise KvDecodeError("trtllm: removed event without block_hashes")
            events.append(BlockRemoved([_hash(h) for h in hashes]))
        elif kind == "created":
            events.append(AllBlocksCleared())
        elif kind == "updated":
            continue
        else:
            raise KvDecodeError(f"trtllm: unknown event type {kind!r}")
    if len(ranks) > 1:
        raise KvDecodeError(f"trtllm: one batch mixes attention DP ranks {sorted(ranks)}")
    return KvEventBatch(time.time(), events, next(iter(ranks)) if ranks else None)


class TrtllmEventDecoder:
    """Decodes the JSON event lists of ``POST /kv_cache_events`` (see the module doc)."""

    name = FORMAT

    def __init__(self) -> None:
        self._json = msgspec.json.Decoder()

    def decode(self, payload: bytes) -> KvEventBatch:
        try:
            raw = self._json.decode(payload)
        except msgspec.DecodeError as exc:
            raise KvDecodeError(f"trtllm: not JSON: {exc}") from None
        return decode_events(raw)

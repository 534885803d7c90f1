"""Write ``data/kv-events-offload-tiers.jsonl``: KV event frames of a vLLM worker with CPU offloading.

Run with the real-vLLM venv (``.venv-vllm/bin/python tests/kv/record_offload_frames.py``).
vLLM on CPU cannot offload (``CPU Offloading is currently only supported on CUDA-alike and
XPU GPUs``), so the events are built with vLLM 0.32's own event classes, with the fields
its ``BlockPool`` and ``OffloadingEventsTracker`` (``offloading/events.py``) fill, and
encoded as its ``ZmqEventPublisher`` encodes them (``msgspec.msgpack.Encoder`` of a
``KVEventBatch``). The batches, one frame each:

0. GPU stores: prompt P (4 blocks of 16) and prompt Q (2 blocks).
1. P offloaded to CPU with ``self_describing_kv_events``: 2 chunks of 2 blocks (offloaded
   block size 32), each with its per-block hashes, parent, tokens, GPU block size.
2. P evicted from the GPU: one ``BlockRemoved`` per block.
3. Q: a legacy placeholder CPU store (no ``self_describing_kv_events``: no tokens,
   ``block_size`` 0), a self-describing ``STORAGE`` store, then Q evicted from the GPU.
4. P's second chunk evicted from the CPU tier.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

import msgspec
from vllm.distributed.kv_events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    MEDIUM_STORAGE,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

BS = 16
P = list(range(1000, 1000 + 4 * BS))
Q = list(range(2000, 2000 + 2 * BS))
FULL = "full_attention"


def hashes(tokens: list[int]) -> list[int]:
    """Stand-ins for vLLM's chained block hashes (64-bit ints, as with int block hashes)."""
    out, prev = [], b""
    for i in range(len(tokens) // BS):
        prev = hashlib.sha256(prev + repr(tokens[i * BS : (i + 1) * BS]).encode()).digest()
        out.append(int.from_bytes(prev[:8], "big"))
    return out


def gpu_store(tokens: list[int]) -> BlockStored:
    return BlockStored(
        block_hashes=hashes(tokens),
        parent_block_hash=None,
        token_ids=tokens,
        block_size=BS,
        lora_id=None,
        medium=MEDIUM_GPU,
        lora_name=None,
        group_idx=0,
        kv_cache_spec_kind=FULL,
    )


def offloaded(tokens: list[int], first: int, blocks: int, medium: str) -> BlockStored:
    """One self-describing chunk: blocks ``first … first+blocks-1`` of ``tokens``."""
    hs = hashes(tokens)
    return BlockStored(
        block_hashes=hs[first : first + blocks],
        parent_block_hash=hs[first - 1] if first else None,
        token_ids=tokens[first * BS : (first + blocks) * BS],
        block_size=BS,
        lora_id=None,
        medium=medium,
        lora_name=None,
        extra_keys=None,
        group_idx=0,
        kv_cache_spec_kind=FULL,
        kv_cache_spec_sliding_window=None,
    )


def batches() -> list[list[object]]:
    p, q = hashes(P), hashes(Q)
    placeholder = BlockStored(
        block_hashes=[q[1]],
        parent_block_hash=None,
        token_ids=[],
        lora_id=None,
        block_size=0,
        medium=MEDIUM_CPU,
        lora_name=None,
        group_idx=0,
    )
    return [
        [gpu_store(P), gpu_store(Q)],
        [offloaded(P, 0, 2, MEDIUM_CPU), offloaded(P, 2, 2, MEDIUM_CPU)],
        [BlockRemoved(block_hashes=[h], medium=MEDIUM_GPU, group_idx=0) for h in p],
        [
            placeholder,
            offloaded(Q, 0, 2, MEDIUM_STORAGE),
            *(BlockRemoved(block_hashes=[h], medium=MEDIUM_GPU, group_idx=0) for h in q),
        ],
        [BlockRemoved(block_hashes=p[2:], medium=MEDIUM_CPU, group_idx=0)],
    ]


def main() -> None:
    pack = msgspec.msgpack.Encoder()
    for seq, events in enumerate(batches()):
        payload = pack.encode(KVEventBatch(ts=time.time(), events=events, data_parallel_rank=None))
        rec = {"topic": "kv-events", "seq": seq, "payload_len": len(payload), "payload_hex": payload.hex()}
        sys.stdout.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()

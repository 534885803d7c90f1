"""Router-side chained block hashes of token ids.

``h_0 = seed(lora_id)``, ``h_i = hash((h_{i-1}, t_{i·bs}, …, t_{(i+1)·bs-1}))`` over full
blocks only. CPython's tuple hash (xxHash-style mixing over the 64-bit hashes of its
items; ints hash to themselves mod 2^61−1) is deterministic across processes
(``PYTHONHASHSEED`` only affects str/bytes) and measured ~3× faster here than
8-byte blake2b digests over packed ints. The hashes never leave the router process, so
they only need to agree with themselves: events and prompts are hashed by this module.

This module is the specification, in pure Python. The ``infera-kv-native`` C extension
computes bit-identical hashes — also straight from an event's msgpack ``token_ids``,
without creating a Python int per token; :mod:`infera_core.kv.accel` picks one.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

ROUTER_HASH_SEED = 0x1FE8A5EED
"""Fixed root of every chain (LoRA adapters fold their id into it)."""


def root_hash(lora_id: int | None = None) -> int:
    """The chain root for ``lora_id`` (None = base model)."""
    if lora_id is None:
        return ROUTER_HASH_SEED
    return hash((ROUTER_HASH_SEED, 0x10AA, lora_id))  # ints only: str hashes are per-process


def py_chain_hashes(token_ids: Sequence[int], block_size: int, parent: int) -> list[int]:
    """Hashes of the full blocks of ``token_ids``, chained from ``parent`` (pure Python)."""
    n = len(token_ids) // block_size * block_size
    out: list[int] = []
    append = out.append
    h = parent
    for i in range(0, n, block_size):
        h = hash((h, *token_ids[i : i + block_size]))
        append(h)
    return out


_INT_LIST = msgspec.msgpack.Decoder(list[int])


def py_chain_hashes_msgpack(packed: bytes, block_size: int, parent: int) -> list[int]:
    """:func:`py_chain_hashes` of a msgpack array of ints; ValueError when it is not one."""
    try:
        tokens = _INT_LIST.decode(packed)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise ValueError(f"token_ids: {exc}") from None
    return py_chain_hashes(tokens, block_size, parent)

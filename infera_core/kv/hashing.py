"""Router-side chained block hashes of token ids.

``h_0 = seed(lora, cache_salt)``, ``h_i = hash((h_{i-1}, t_{i·bs}, …, t_{(i+1)·bs-1}))`` over
full blocks only. A chain's root folds in what the engine folds into its first block's hash
besides the tokens — the LoRA adapter's name and the request's ``cache_salt`` (vLLM's
``generate_block_hash_extra_keys``; SGLang's salted radix keys) — so a salted or LoRA prefix
has its own root and is never credited to another prompt with the same tokens. Blocks with
content the token ids do not show (multimodal items, prompt embeddings: the rest of vLLM's
``extra_keys``) fold those keys into their own hash (:func:`fold_extra_keys`): no text
prompt can reach them. CPython's tuple hash (xxHash-style mixing over the 64-bit hashes of its
items; ints hash to themselves mod 2^61−1) is deterministic across processes
(``PYTHONHASHSEED`` only affects str/bytes) and measured ~3× faster here than
8-byte blake2b digests over packed ints. The hashes never leave the router process, so
they only need to agree with themselves: events and prompts are hashed by this module.

This module is the specification, in pure Python. The ``infera-kv-native`` C extension
computes bit-identical hashes — also straight from an event's msgpack ``token_ids``,
without creating a Python int per token; :mod:`infera_core.kv.accel` picks one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import msgspec

from infera_core.kv.events import BlockStored, BlockStoredRaw, event_salt

ROUTER_HASH_SEED = 0x1FE8A5EED
"""Fixed root of every chain (LoRA adapters and cache salts fold into it)."""
_LORA_TAG = 0x10AA
_NAMESPACE_TAG = 0x5A17
_EXTRA_TAG = 0xE7A5
DYNAMO_SALT_PREFIX = "dynamo-cache-salt:"
"""How SGLang (and Dynamo's router) spell a cache salt inside ``extra_keys``."""


def root_hash(lora_id: int | None = None) -> int:
    """The chain root for ``lora_id`` (None = base model)."""
    if lora_id is None:
        return ROUTER_HASH_SEED
    return hash((ROUTER_HASH_SEED, _LORA_TAG, lora_id))  # ints only: str hashes are per-process


def _digest_int(data: bytes) -> int:
    """A stable 63-bit int of ``data`` (str/bytes hashes vary per process: never ``hash(str)``)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def namespace_root(
    lora_name: str | None = None, cache_salt: str | None = None, lora_id: int | None = None
) -> int:
    """The chain root of a prompt served with LoRA adapter ``lora_name`` and ``cache_salt``.

    Neither: the base root (or the legacy ``root_hash(lora_id)`` of an engine that names its
    adapter by id only). The same in every router process and replica."""
    if lora_name is None and cache_salt is None:
        return root_hash(lora_id)
    lora = _digest_int(lora_name.encode("utf-8", "surrogatepass")) if lora_name is not None else 0
    salt = _digest_int(cache_salt.encode("utf-8", "surrogatepass")) if cache_salt is not None else 0
    return hash((ROUTER_HASH_SEED, _NAMESPACE_TAG, lora, salt))


def fold_extra_keys(parent: int, keys: Any) -> int:
    """``parent`` with a block's foreign extra keys (multimodal items, embeddings) folded in."""
    try:
        packed = msgspec.msgpack.encode(keys)
    except (TypeError, ValueError):
        packed = repr(keys).encode("utf-8", "surrogatepass")
    return hash((parent, _EXTRA_TAG, _digest_int(packed)))


def split_extra_keys(keys: Any, lora_name: str | None, first: bool) -> tuple[str | None, list[Any]]:
    """One block's ``extra_keys`` as (cache salt, foreign keys).

    vLLM 0.32 publishes each block's keys untagged, in this order: the LoRA name (when the event
    has ``lora_name``), ``(mm identifier, offset)`` pairs, the ``cache_salt`` (first block of a
    prompt only) and prompt-embedding digests. SGLang puts ``"dynamo-cache-salt:<salt>"`` there.
    The LoRA name and the salt are the chain's namespace (:func:`namespace_root`); anything else
    is content the token ids do not show."""
    if keys is None:
        return None, []
    items = list(keys) if isinstance(keys, list | tuple) else [keys]
    if lora_name is not None and items and items[0] == lora_name:
        items = items[1:]
    salt: str | None = None
    foreign: list[Any] = []
    for item in items:
        if isinstance(item, str) and item.startswith(DYNAMO_SALT_PREFIX):
            salt = item[len(DYNAMO_SALT_PREFIX) :]
        elif isinstance(item, str) and first and salt is None:
            salt = item
        else:
            foreign.append(item)
    return salt, foreign


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


def event_root(ev: BlockStored | BlockStoredRaw) -> int:
    """The namespace root of a stored run that starts a chain (its parent is None): its LoRA
    name and cache salt (SGLang's field, or the salt in its first block's ``extra_keys``)."""
    keys = ev.extra_keys[0] if ev.extra_keys else None
    salt = event_salt(ev) or split_extra_keys(keys, ev.lora_name, True)[0]
    return namespace_root(ev.lora_name, salt, ev.lora_id)


def keyed_chain(
    tokens: Sequence[int],
    block_size: int,
    blocks: int,
    parent: int,
    ev: BlockStored | BlockStoredRaw,
    root: bool,
) -> list[int]:
    """Router hashes of a stored run with ``extra_keys``, chained from ``parent``: a block whose
    keys hold more than the namespace (multimodal items, embeddings) folds them into its hash
    (and so into every block after it). ``root``: the run starts a prompt (its first block may
    carry the salt)."""
    extra = ev.extra_keys or []
    out: list[int] = []
    h = parent
    for i in range(min(blocks, len(tokens) // block_size)):
        keys = extra[i] if i < len(extra) else None
        if keys is not None:
            foreign = split_extra_keys(keys, ev.lora_name, root and i == 0)[1]
            if foreign:
                h = fold_extra_keys(h, foreign)
        h = hash((h, *tokens[i * block_size : (i + 1) * block_size]))
        out.append(h)
    return out

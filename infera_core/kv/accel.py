"""The KV index's hot loops, in pure Python or from the ``infera-kv-native`` C extension.

:data:`ops` holds the implementation in use: the C extension when it is importable
(``pip install infera-kv-native``; a dependency of infera-core, built where a C compiler
exists), else the pure-Python functions below and in :mod:`infera_core.kv.hashing`, which
are the specification: tests check that both give identical results. ``INFERA_KV_NATIVE=0``
in the environment, or :func:`use_native`, selects pure Python.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from infera_core.kv.events import BlockHash
from infera_core.kv.hashing import py_chain_hashes, py_chain_hashes_msgpack


def py_store_blocks(
    emap: dict[BlockHash, int],
    masks: dict[int, int],
    dups: dict[int, int],
    block_hashes: list[BlockHash],
    hashes: list[int],
    bit: int,
) -> int:
    """Mirror stored blocks (engine hash → router hash); returns how many became newly held.

    An engine hash already mirrored is left alone; a router hash this view already holds
    under another engine hash (cache_salt, extra keys…) is counted in ``dups``.
    """
    added = 0
    for eh, h in zip(block_hashes, hashes, strict=False):
        if emap.setdefault(eh, h) is not h:
            continue
        m = masks.get(h, 0)
        if m & bit:
            dups[h] = dups.get(h, 0) + 1
        else:
            masks[h] = m | bit
            added += 1
    return added


def py_remove_blocks(
    emap: dict[BlockHash, int],
    masks: dict[int, int],
    dups: dict[int, int],
    block_hashes: list[BlockHash],
    nbit: int,
) -> tuple[int, int]:
    """Forget removed blocks; returns (router hashes no longer held, engine hashes unknown)."""
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
    return removed, unknown


class Ops:
    """One implementation of the hot loops."""

    __slots__ = ("chain_hashes", "chain_hashes_msgpack", "name", "remove_blocks", "store_blocks")

    def __init__(
        self,
        name: str,
        chain_hashes: Callable[[Sequence[int], int, int], list[int]],
        chain_hashes_msgpack: Callable[[bytes, int, int], list[int]],
        store_blocks: Callable[
            [dict[BlockHash, int], dict[int, int], dict[int, int], list[BlockHash], list[int], int], int
        ],
        remove_blocks: Callable[
            [dict[BlockHash, int], dict[int, int], dict[int, int], list[BlockHash], int], tuple[int, int]
        ],
    ) -> None:
        self.name = name
        self.chain_hashes = chain_hashes
        self.chain_hashes_msgpack = chain_hashes_msgpack
        """Raises ValueError when the packed token ids are not a msgpack array of ints."""
        self.store_blocks = store_blocks
        self.remove_blocks = remove_blocks


PYTHON = Ops("python", py_chain_hashes, py_chain_hashes_msgpack, py_store_blocks, py_remove_blocks)


def native_ops() -> Ops | None:
    """The C extension's implementation, or None when it is not installed or not built."""
    try:
        import infera_kv_native as nat
    except ImportError:
        return None
    if not nat.available:
        return None
    return Ops("native", nat.chain_hashes, nat.chain_hashes_msgpack, nat.store_blocks, nat.remove_blocks)


ops: Ops = PYTHON
"""The implementation in use (read at each call, so :func:`use_native` takes effect at once)."""


def use_native(enabled: bool = True) -> Ops:
    """Select the native implementation when ``enabled`` and available; returns the one in use."""
    global ops
    ops = (native_ops() if enabled else None) or PYTHON
    return ops


use_native(os.environ.get("INFERA_KV_NATIVE", "1") != "0")

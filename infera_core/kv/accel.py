"""The KV index's hot loops, in pure Python or from the ``infera-kv-native`` C extension.

:data:`ops` holds the implementation in use: the C extension when it is importable
(``pip install infera-kv-native``; a dependency of infera-core, built where a C compiler
exists), else the pure-Python functions in :mod:`infera_core.kv.hashing` and
:mod:`infera_core.kv.store`, which are the specification: tests check that both give
identical results. ``INFERA_KV_NATIVE=0`` in the environment, or :func:`use_native`,
selects pure Python. A :class:`~infera_core.kv.index.KvIndex` takes its block store from
the implementation in use when it is created.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from infera_core.kv.hashing import py_chain_hashes, py_chain_hashes_msgpack
from infera_core.kv.store import BlockStore, PyBlockStore


class Ops:
    """One implementation of the hot loops."""

    __slots__ = ("batch_dp_rank", "chain_hashes", "chain_hashes_msgpack", "name", "new_store")

    def __init__(
        self,
        name: str,
        chain_hashes: Callable[[Sequence[int], int, int], list[int]],
        chain_hashes_msgpack: Callable[[bytes, int, int], list[int]],
        new_store: Callable[[], BlockStore],
        batch_dp_rank: Callable[[bytes], int | None] | None = None,
    ) -> None:
        self.name = name
        self.chain_hashes = chain_hashes
        self.chain_hashes_msgpack = chain_hashes_msgpack
        """Raises ValueError when the packed token ids are not a msgpack array of ints."""
        self.new_store = new_store
        self.batch_dp_rank = batch_dp_rank
        """The dp_rank of a msgpack ``[ts, events, dp_rank]`` payload (ValueError when it is
        not one), for stores that ingest payloads whole; None when the store cannot."""


PYTHON = Ops("python", py_chain_hashes, py_chain_hashes_msgpack, PyBlockStore)


def native_ops() -> Ops | None:
    """The C extension's implementation, or None when it is not installed or not built."""
    try:
        import infera_kv_native as nat
    except ImportError:
        return None
    if not nat.available:
        return None
    return Ops("native", nat.chain_hashes, nat.chain_hashes_msgpack, nat.Index, nat.batch_dp_rank)


ops: Ops = PYTHON
"""The implementation in use (read at each call, so :func:`use_native` takes effect at once)."""


def use_native(enabled: bool = True) -> Ops:
    """Select the native implementation when ``enabled`` and available; returns the one in use."""
    global ops
    ops = (native_ops() if enabled else None) or PYTHON
    return ops


use_native(os.environ.get("INFERA_KV_NATIVE", "1") != "0")

"""Native hot loops for Infera's KV index (see ``infera_core.kv.accel``).

``available`` is False when the C extension was not built (no compiler at install time);
infera-core then runs its pure-Python implementation, with identical results.
"""

from __future__ import annotations

try:
    from infera_kv_native._chain import (
        Index,
        batch_dp_rank,
        chain_hashes,
        chain_hashes_msgpack,
        fold_key,
        predicted_ttft,
    )
except ImportError:  # built without a compiler
    available = False
else:
    available = True

__all__ = [
    "Index",
    "available",
    "batch_dp_rank",
    "chain_hashes",
    "chain_hashes_msgpack",
    "fold_key",
    "predicted_ttft",
]

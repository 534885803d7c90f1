"""Native hot loops for Infera's KV index (see ``infera_core.kv.accel``) and the
``predicted-latency`` scorer's pass over its candidates (``infera_core.scheduling.arrays``).

``available`` is False when the C extension was not built (no compiler at install time);
infera-core then runs its pure-Python implementation, with identical results.
``predicted_ttft`` is None when it was not built or was built before it had that loop.
"""

from __future__ import annotations

from collections.abc import Callable

try:
    from infera_kv_native._chain import Index, batch_dp_rank, chain_hashes, chain_hashes_msgpack, fold_key
except ImportError:  # built without a compiler
    available = False
else:
    available = True

predicted_ttft: Callable[..., float] | None
try:
    from infera_kv_native._chain import predicted_ttft
except ImportError:  # not built, or built from older sources: numpy runs it
    predicted_ttft = None

__all__ = [
    "Index",
    "available",
    "batch_dp_rank",
    "chain_hashes",
    "chain_hashes_msgpack",
    "fold_key",
    "predicted_ttft",
]

"""Native hot loops for Infera's KV index (see ``infera_core.kv.accel``) and the
``predicted-latency`` scorer's pass over its candidates (``infera_core.scheduling.arrays``).

``available`` is False when the C extension was not built (no compiler at install time);
infera-core then runs its pure-Python implementation, with identical results.
``predicted_ttft`` and ``weighted_sum`` (the scheduler's weighted sum of scores) are None when
they were not built or were built before they existed.
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

weighted_sum: Callable[..., None] | None
try:
    from infera_kv_native._chain import weighted_sum
except ImportError:  # not built, or built from older sources: numpy runs it
    weighted_sum = None

__all__ = [
    "Index",
    "available",
    "batch_dp_rank",
    "chain_hashes",
    "chain_hashes_msgpack",
    "fold_key",
    "predicted_ttft",
    "weighted_sum",
]

"""SGLang KV event decoder registration (``kv_events.format = "sglang"``).

SGLang copied vLLM's publisher: the same ``[ts, events, dp_rank]`` batches, map layout
in 0.5.23 (arrays before). Differences handled by the core decoder with
``signed_hashes=True``: hashes are the first 8 bytes of a SHA-256 read as a *signed*
int64 (normalized to u64), EAGLE/MTP sends ``token_ids`` as bigram pairs (the first of
each is kept), a salted ``BlockStored`` is a ``BlockStoredWithMetadata`` whose
``metadata.cache_salt`` (and ``extra_keys`` ``"dynamo-cache-salt:<salt>"``) the core
decoder keeps, so the index roots the block in its salt (``session_id`` and the like are
ignored), and ``medium`` may be ``GPU``, ``CPU_PINNED``, ``DISK`` or ``EXTERNAL``. One
``BlockStored`` per page (``--page-size``).
"""

from __future__ import annotations

from infera_core.kv.decode import MsgpackEventDecoder


def sglang_decoder() -> MsgpackEventDecoder:
    return MsgpackEventDecoder("sglang", signed_hashes=True)

"""vLLM KV event decoder registration (``kv_events.format = "vllm"``).

vLLM ≥ 0.24 sends map-layout events tagged ``"type"`` with u64 int hashes (bytes when
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``); older versions send tagged arrays. The
generic decoder in core handles both, keeping ``lora_name`` and the per-block
``extra_keys`` (LoRA name, multimodal items, ``cache_salt``) the index roots salted, LoRA
and multimodal blocks with; this module only names it.
"""

from __future__ import annotations

from infera_core.kv.decode import MsgpackEventDecoder


def vllm_decoder() -> MsgpackEventDecoder:
    return MsgpackEventDecoder("vllm", signed_hashes=False)

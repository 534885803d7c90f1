"""Storage tiers of mirrored blocks (GPU, CPU, disk) from the engines' ``medium`` names, and
which KV-cache groups the index keeps."""

from __future__ import annotations

TIER_GPU, TIER_CPU, TIER_DISK = 0, 1, 2
TIERS = (TIER_GPU, TIER_CPU, TIER_DISK)
TIER_NAMES = ("gpu", "cpu", "disk")
_MEDIUM_TIER = {
    None: 0,
    "GPU": 0,
    "HBM": 0,
    "CPU": 1,
    "CPU_PINNED": 1,
    "CPU_TIER1": 1,
    "DISK": 2,
    "STORAGE": 2,
    "EXTERNAL": 2,
    "CPU_TIER2": 2,
    "REMOTE": 2,
}
"""The ``medium`` names engines really emit, by tier (any case; anything else counts as disk):

* vLLM 0.32: ``GPU`` (block pool), ``CPU`` / ``STORAGE`` (``vllm.distributed.kv_events``
  ``MEDIUM_*``; the offloading connector's ``kv_offload.base.Medium``);
* SGLang: ``GPU`` (L1), ``CPU_PINNED`` (HiCache L2 host pool), ``DISK`` (L3 SSD), ``EXTERNAL``
  (L3/L4 shared pool such as Mooncake) — ``StorageMedium`` in
  ``python/sglang/srt/disaggregation/kv_events.py`` since sgl-project/sglang#22894; the releases
  between #18205 and it named the host tier ``CPU_TIER1`` and storage ``CPU_TIER2``;
* ATOM: ``GPU``, ``CPU``, ``DISK``, ``REMOTE`` (blocks a PD decode received;
  ``atom/distributed/kv_events.py``);
* LMCache (vLLM ``LMCacheConnectorV1``): ``"cpu"`` (``LMCacheEngine.store``).
"""


def medium_tier(medium: str | None) -> int:
    """GPU (or unspecified) → 0, CPU → 1, disk/external/unknown → 2."""
    tier = _MEDIUM_TIER.get(medium)
    if tier is None:
        up = medium.upper() if medium else None
        tier = _MEDIUM_TIER.get(up, 2)
    return tier


def indexed_kind(kind: str | None) -> bool:
    """Only full-attention and MLA groups share prefixes the way prompts do."""
    return kind is None or kind == "full_attention" or kind.startswith("mla")

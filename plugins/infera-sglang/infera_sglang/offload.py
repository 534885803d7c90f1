"""KV offloading for SGLang workers: HiCache (host memory, then a storage backend) or LMCache.

HiCache keeps the radix tree's evicted pages in a host memory pool (``--hicache-ratio`` ×
the GPU pool, or ``--hicache-size`` GB, which wins) and optionally behind it a storage
backend (``--hicache-storage-backend file|mooncake|hf3fs|nixl|…``). Giving any ``--hicache-*``
option turns it on (``--enable-hierarchical-cache``). Flag names and values follow
``sglang/srt/server_args.py``. ``--lmcache-config FILE`` uses LMCache instead
(``--enable-lmcache --lmcache-config-file``); the two are alternatives.

The router credits what the KV events say: a page event with ``medium`` CPU_PINNED (HiCache's
host pool; ``CPU_TIER1`` in older builds) at the CPU tier weight, DISK/EXTERNAL (``CPU_TIER2``
in older builds) at the disk weight (``infera_core.kv.tiers.medium_tier``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infera_core.engines.base import EngineOption
from infera_core.errors import EngineError

if TYPE_CHECKING:
    from infera_core.engines.base import LaunchContext

WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")

OPTIONS: tuple[EngineOption, ...] = (
    EngineOption(
        "enable_hierarchical_cache",
        bool,
        False,
        "SGLang HiCache: pages evicted from the GPU stay reusable from host memory "
        "(implied by any --hicache-* option).",
        is_flag=True,
    ),
    EngineOption(
        "hicache_ratio",
        float,
        None,
        "HiCache host pool size as a multiple of the GPU KV pool (SGLang --hicache-ratio) "
        "[default: SGLang's, 2.0].",
    ),
    EngineOption(
        "hicache_size",
        int,
        None,
        "HiCache host pool in GB (SGLang --hicache-size; overrides --hicache-ratio).",
    ),
    EngineOption(
        "hicache_write_policy",
        str,
        None,
        "When pages are copied to host memory (SGLang --hicache-write-policy) [default: write_through].",
        choices=WRITE_POLICIES,
    ),
    EngineOption(
        "hicache_storage_backend",
        str,
        None,
        "HiCache third tier behind host memory (SGLang --hicache-storage-backend: file, mooncake, "
        "hf3fs, nixl, aibrix, dynamic… as the installed SGLang offers).",
    ),
    EngineOption(
        "hicache_storage_backend_extra_config",
        str,
        None,
        "JSON (or @file) for the storage backend (SGLang --hicache-storage-backend-extra-config).",
    ),
    EngineOption(
        "lmcache_config",
        str,
        None,
        "LMCache instead of HiCache, with this LMCache YAML config (SGLang --enable-lmcache "
        "--lmcache-config-file).",
    ),
)

_VALUED = (
    ("hicache_ratio", "--hicache-ratio"),
    ("hicache_size", "--hicache-size"),
    ("hicache_write_policy", "--hicache-write-policy"),
    ("hicache_storage_backend", "--hicache-storage-backend"),
    ("hicache_storage_backend_extra_config", "--hicache-storage-backend-extra-config"),
)


def offload_flags(ctx: LaunchContext) -> list[str]:
    """SGLang flags for HiCache or LMCache (none when neither is asked for)."""
    opts = ctx.options
    given = [(name, flag, opts[name]) for name, flag in _VALUED if opts.get(name) not in (None, "")]
    hicache = bool(opts.get("enable_hierarchical_cache")) or bool(given)
    lmcache = opts.get("lmcache_config") or None
    if hicache and lmcache:
        raise EngineError(
            "--lmcache-config and HiCache (--enable-hierarchical-cache/--hicache-*) are alternatives: give one"
        )
    if lmcache:
        return ["--enable-lmcache", "--lmcache-config-file", str(lmcache)]
    if not hicache:
        return []
    flags = ["--enable-hierarchical-cache"]
    for name, flag, value in given:
        if name == "hicache_ratio" and not float(value) > 0:
            raise EngineError(f"--hicache-ratio {value}: must be > 0 (host pool / GPU pool)")
        if name == "hicache_size" and int(value) <= 0:
            raise EngineError(f"--hicache-size {value}: must be a positive number of GB")
        if name == "hicache_write_policy" and value not in WRITE_POLICIES:
            raise EngineError(f"--hicache-write-policy {value}: choose {', '.join(WRITE_POLICIES)}")
        flags += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return flags

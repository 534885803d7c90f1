"""KV offloading for vLLM workers: native CPU offloading and LMCache.

Three ways, as vLLM 0.32 offers them:

* ``--kv-offloading-size GIB`` (``--kv-offloading-backend native``, the default): vLLM's
  own CPU tier. vLLM turns the flag into ``kv_connector: OffloadingConnector`` with
  ``cpu_bytes_to_use``; Infera adds ``self_describing_kv_events: true`` to
  ``kv_connector_extra_config`` so the CPU tier's ``BlockStored`` events carry token ids
  (without it they are placeholders the router cannot index).
* ``--kv-offloading-backend lmcache``: vLLM's ``LMCacheMPConnector``, which talks to a
  standalone LMCache server (``lmcache.mp.host``/``lmcache.mp.port`` in
  ``kv_connector_extra_config``, default ``tcp://localhost:5555``); the server owns the
  capacity.
* ``--lmcache-config FILE``: in-process LMCache, ``kv_connector: LMCacheConnectorV1`` with
  ``LMCACHE_CONFIG_FILE`` (its YAML: ``chunk_size``, ``local_cpu``,
  ``max_local_cpu_size``…).

vLLM's offloading flags *replace* ``kv_connector``, so on a prefill/decode worker they
would drop the PD connector: there Infera asks for a ``MultiConnector`` of the PD connector
and the offloading one instead of passing the flags, and the ``multi`` transfer connector
(:mod:`infera_vllm.transfer`) builds it like any user-given MultiConnector.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infera_core.engines.base import EngineOption, FlagAlias
from infera_core.errors import EngineError
from infera_core.worker import Role

if TYPE_CHECKING:
    from infera_core.engines.base import LaunchContext

BACKENDS = ("native", "lmcache")
GIB = 1 << 30
OFFLOADING = "OffloadingConnector"
LMCACHE_MP = "LMCacheMPConnector"
LMCACHE_V1 = "LMCacheConnectorV1"
OFFLOAD_CONNECTORS = (OFFLOADING, "SimpleCPUOffloadConnector", LMCACHE_MP, LMCACHE_V1)
SELF_DESCRIBING = "self_describing_kv_events"

OPTIONS: tuple[EngineOption, ...] = (
    EngineOption(
        "kv_offloading_size",
        float,
        None,
        "KV offloading buffer in GiB (vLLM --kv-offloading-size; the total over TP ranks): "
        "blocks evicted from the GPU stay reusable from CPU memory. KV events then report "
        "CPU-tier blocks (medium CPU), which the router credits at its cpu tier weight.",
    ),
    EngineOption(
        "kv_offloading_backend",
        str,
        None,
        "native (vLLM's OffloadingConnector) or lmcache (LMCacheMPConnector: a standalone LMCache "
        "server, lmcache.mp.host/port in --kv-transfer-config's kv_connector_extra_config) "
        "[default: native].",
        choices=BACKENDS,
    ),
    EngineOption(
        "lmcache_config",
        str,
        None,
        "In-process LMCache (LMCacheConnectorV1) with this LMCache YAML config (LMCACHE_CONFIG_FILE).",
    ),
)

ALIASES: Mapping[str, FlagAlias] = {
    "--kv-offloading-size": FlagAlias("--kv-offloading-size"),
    "--kv-offloading-backend": FlagAlias("--kv-offloading-backend"),
}
"""vLLM's own offloading flags after ``--`` become Infera's (which know about PD and KV events)."""

MANAGED_FLAGS = {flag: flag for flag in ALIASES}


@dataclass(slots=True)
class OffloadPlan:
    """What offloading makes of a launch: the ``--kv-transfer-config`` to build the transfer
    plan from, vLLM flags, environment."""

    config: dict[str, Any]
    flags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def _size(ctx: LaunchContext) -> float | None:
    raw = ctx.options.get("kv_offloading_size")
    if raw in (None, ""):
        return None
    size = float(raw)
    if not size > 0:
        raise EngineError(f"--kv-offloading-size {raw}: must be a positive number of GiB")
    return size


def _backend(ctx: LaunchContext, size: float | None) -> str | None:
    backend = ctx.options.get("kv_offloading_backend")
    if backend in (None, ""):
        return "native" if size is not None else None
    if backend not in BACKENDS:
        raise EngineError(f"--kv-offloading-backend {backend}: choose {' or '.join(BACKENDS)}")
    if size is None:
        raise EngineError(
            f"--kv-offloading-backend {backend} needs --kv-offloading-size (vLLM offloads only with a size)"
        )
    return str(backend)


def _extra(config: Mapping[str, Any]) -> dict[str, Any]:
    extra = config.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise EngineError("--kv-transfer-config kv_connector_extra_config must be a JSON object")
    return dict(extra)


def _child(ctx: LaunchContext, size: float | None, backend: str | None) -> dict[str, Any]:
    """The offloading connector as a MultiConnector child (what vLLM's flags would make)."""
    if ctx.options.get("lmcache_config"):
        return {"kv_connector": LMCACHE_V1, "kv_role": "kv_both"}
    if backend == "lmcache":
        return {"kv_connector": LMCACHE_MP, "kv_role": "kv_both"}
    assert size is not None
    extra = {"cpu_bytes_to_use": int(size * GIB), SELF_DESCRIBING: True}
    return {"kv_connector": OFFLOADING, "kv_role": "kv_both", "kv_connector_extra_config": extra}


def plan_offload(
    ctx: LaunchContext,
    config: Mapping[str, Any],
    pd_connector: str | None = "NixlConnector",
    pd_name: str = "nixl",
) -> OffloadPlan:
    """Offloading applied to ``config``, the user's ``--kv-transfer-config`` (``{}`` for none).

    ``pd_connector``: the PD connector's vLLM name (prefill/decode workers whose config
    names none: the one ``--pd-connector`` picks); None when that connector (``pd_name``, a
    plugin's) has no vLLM class to put in a MultiConnector: offloading there is one error line.
    """
    size = _size(ctx)
    backend = _backend(ctx, size)
    lmcache_file = ctx.options.get("lmcache_config") or None
    config = dict(config)
    if lmcache_file is not None and size is not None:
        raise EngineError(
            "--lmcache-config (in-process LMCache) and --kv-offloading-size (vLLM's offloading) are two "
            "offloading setups: give one"
        )
    env = {"LMCACHE_CONFIG_FILE": str(lmcache_file)} if lmcache_file else {}
    if backend is None and lmcache_file is None:
        return OffloadPlan(config)
    named = config.get("kv_connector")
    if ctx.role is not Role.MIXED:
        if pd_connector is None and named is None:
            flag = "--lmcache-config" if lmcache_file is not None else "--kv-offloading-size"
            raise EngineError(
                f"--pd-connector {pd_name} with {flag}: offloading on a prefill/decode worker runs in a "
                f"vLLM MultiConnector beside the PD connector, and {pd_name} (a plugin's) names no vLLM "
                f"kv_connector class for it; drop {flag}, or have its plugin list its class in native"
            )
        return OffloadPlan(_compose(config, _child(ctx, size, backend), pd_connector or ""), env=env)
    if lmcache_file is not None:
        if named not in (None, LMCACHE_V1):
            raise _replaced(str(named), "--lmcache-config")
        return OffloadPlan({**config, "kv_connector": LMCACHE_V1, "kv_role": "kv_both"}, env=env)
    if named is not None and named not in OFFLOAD_CONNECTORS:  # vLLM would overwrite it
        raise _replaced(str(named), "--kv-offloading-size")
    flags = ["--kv-offloading-size", f"{size:g}", "--kv-offloading-backend", str(backend)]
    if backend == "native":
        config["kv_connector_extra_config"] = {**_extra(config), SELF_DESCRIBING: True}
    return OffloadPlan(config, flags=flags)


def _replaced(named: str, flag: str) -> EngineError:
    return EngineError(
        f"{flag} makes vLLM's kv_connector the offloading one, replacing --kv-transfer-config's "
        f"{named}: compose them in a MultiConnector (kv_connector_extra_config.connectors) instead"
    )


def _compose(user: dict[str, Any], child: dict[str, Any], pd_connector: str) -> dict[str, Any]:
    """A MultiConnector of the user's PD connector (or ``pd_connector``) and ``child``."""
    if user.get("kv_connector") == "MultiConnector":
        extra = _extra(user)
        children = list(extra.get("connectors") or [])
        if any(isinstance(c, dict) and c.get("kv_connector") in OFFLOAD_CONNECTORS for c in children):
            raise EngineError(
                "--kv-transfer-config's MultiConnector already has an offloading connector: drop "
                "--kv-offloading-size/--lmcache-config or that child"
            )
        return {**user, "kv_connector_extra_config": {**extra, "connectors": [*children, child]}}
    # the PD child keeps the user's fields; the outer config only the worker's engine_id
    first = {k: v for k, v in user.items() if k != "engine_id"}
    first.setdefault("kv_connector", pd_connector)
    outer: dict[str, Any] = {"kv_connector": "MultiConnector"}
    if "engine_id" in user:
        outer["engine_id"] = user["engine_id"]
    outer["kv_connector_extra_config"] = {"connectors": [first, child]}
    return outer

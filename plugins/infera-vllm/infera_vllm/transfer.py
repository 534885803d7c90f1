"""vLLM KV transfer connectors (``--kv-transfer-config``) for prefill/decode workers.

Each is an :class:`infera_core.engines.transfer.TransferConnector` registered by the plugin:
``nixl`` (NixlConnector), ``mooncake`` (MooncakeConnector), ``moriio`` (MoRIIOConnector,
AMD MoRI-IO) and ``multi`` (MultiConnector: one PD connector composed with others, e.g.
an offloading or LMCache connector). The user's ``--kv-transfer-config`` is merged with
what Infera needs (``kv_role`` for the role, ``engine_id`` = the worker id, ports);
a field that contradicts the role is one error line. Field names follow vLLM's
``KVTransferConfig`` and the connectors' ``kv_connector_extra_config`` keys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infera_core.engines.support import dp_layout, free_ports
from infera_core.engines.transfer import (
    TransferConnector,
    TransferPlan,
    check_kv_role,
    check_one_sided_mixed,
    connectors_for,
    extra_config,
    find_connector,
    one_pd_child,
    parse_user_config,
    resolve_plan,
)
from infera_core.errors import EngineError
from infera_core.worker import PdInfo, Role
from infera_vllm.offload import plan_offload

if TYPE_CHECKING:
    from infera_core.engines.base import LaunchContext

ENGINE = "vllm"
BOTH = {Role.PREFILL: ("kv_producer", "kv_both"), Role.DECODE: ("kv_consumer", "kv_both")}
ONE_SIDED = {Role.PREFILL: ("kv_producer",), Role.DECODE: ("kv_consumer",)}
KEYS = ("handshake_port", "notify_port")
MORIIO_READ_VALUES = ("true", "1")
"""vLLM's ``get_moriio_mode``: ``read_mode`` "true"/"1" (any case) is READ, else WRITE."""
MORIIO_DP_SIZE_LOCAL = 1
"""vLLM's ``data_parallel_size_local`` for an external-LB rank (one engine per launcher)."""


def _tp(ctx: LaunchContext) -> int:
    return int(ctx.options.get("tp") or 1)


def _dp(ctx: LaunchContext) -> tuple[int, int]:
    """(rank, size) of this external-LB launcher: vLLM offsets per-rank ports by the rank."""
    rank, size = dp_layout(ctx)
    return (rank or 0) if size > 1 else 0, size


def engine_id(worker_id: str, rank: int | None, size: int) -> str:
    """The KV connector engine id vLLM really uses for this DP rank.

    vLLM 0.32 appends ``_dp<rank>`` to ``kv_transfer_config.engine_id`` in every engine core
    of a data-parallel deployment (``EngineCoreProc.run_engine_core``: when
    ``data_parallel_size > 1 or dp_rank > 0``), so an external-LB rank ``K`` of worker ``w``
    registers as ``w_dpK`` (e.g. with its Mooncake bootstrap server).
    """
    rank = rank or 0
    return f"{worker_id}_dp{rank}" if size > 1 or rank > 0 else worker_id


def _base_config(
    ctx: LaunchContext, user: dict[str, Any], kv_connector: str, allowed: tuple[str, ...]
) -> dict[str, Any]:
    """The user's config with Infera's ``kv_connector``, ``kv_role`` and ``engine_id``."""
    kv_role = check_kv_role(user, ctx.role, allowed, kv_connector) or allowed[0]
    if user.get("engine_id", ctx.worker_id) != ctx.worker_id:
        raise EngineError(
            f"--kv-transfer-config engine_id {user['engine_id']}: Infera sets it to the worker id "
            f"({ctx.worker_id}); pass --worker-id instead"
        )
    return {**user, "kv_connector": kv_connector, "kv_role": kv_role, "engine_id": ctx.worker_id}


class NixlConnector:
    """NixlConnector: decode pulls from prefill (serial; side channel per DP rank)."""

    engine = ENGINE
    name = "nixl"
    native = ("NixlConnector",)
    description = "vLLM NixlConnector (NIXL pull; router protocol vllm-nixl)"

    def build(self, ctx: LaunchContext, user: dict[str, Any]) -> TransferPlan:
        role = ctx.role
        allowed = ("kv_both", BOTH[role][0])
        config = _base_config(ctx, user, "NixlConnector", allowed)
        port = free_ports(ctx)[0]
        rank, _ = _dp(ctx)
        env = {
            "VLLM_NIXL_SIDE_CHANNEL_HOST": ctx.advertise_host,
            # vLLM listens on VLLM_NIXL_SIDE_CHANNEL_PORT + its data-parallel rank
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(port - rank),
        }
        params = {
            "engine_id": engine_id(ctx.worker_id, *_dp(ctx)),
            "tp_size": _tp(ctx),
            "side_channel_host": ctx.advertise_host,
            "side_channel_port": port,
        }
        pd = PdInfo(protocol="vllm-nixl", params=params)
        return TransferPlan(engine=ENGINE, role=role, connector=self.name, config=config, env=env, pd=pd)


class MooncakeConnector:
    """MooncakeConnector: prefill pushes to decode (concurrent; bootstrap server on prefill)."""

    engine = ENGINE
    name = "mooncake"
    native = ("MooncakeConnector",)
    description = "vLLM MooncakeConnector (push; router protocol vllm-mooncake)"

    def build(self, ctx: LaunchContext, user: dict[str, Any]) -> TransferPlan:
        config = _base_config(ctx, user, "MooncakeConnector", BOTH[ctx.role])
        # the decode leg names this id (remote_engine_id): the one vLLM registers per DP rank
        params: dict[str, Any] = {"engine_id": engine_id(ctx.worker_id, *_dp(ctx)), "tp_size": _tp(ctx)}
        env: dict[str, str] = {}
        address = extra_config(user).get("bootstrap_server_address")
        if ctx.role is Role.PREFILL and address:
            # the user's own bootstrap server (vLLM's get_mooncake_bootstrap_addr reads it first)
            host, _, port_text = str(address).rpartition(":")
            if not host or not port_text.isdigit():
                raise EngineError(
                    f"--kv-transfer-config kv_connector_extra_config.bootstrap_server_address {address}: "
                    "expected host:port"
                )
            params["bootstrap_host"] = host.strip("[]")
            params["bootstrap_port"] = int(port_text)
        elif ctx.role is Role.PREFILL:
            port = free_ports(ctx)[0]
            env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(port)
            params["bootstrap_host"] = ctx.advertise_host
            params["bootstrap_port"] = port
        pd = PdInfo(protocol="vllm-mooncake", params=params)
        return TransferPlan(engine=ENGINE, role=ctx.role, connector=self.name, config=config, env=env, pd=pd)


class MoriioConnector:
    """MoRIIOConnector (AMD MoRI-IO RDMA): WRITE mode (prefill writes, concurrent) by default,
    READ mode (decode reads after prefill, serial) with ``read_mode: true``.

    vLLM reads ``handshake_port``, ``notify_port`` and ``http_port`` from
    ``kv_connector_extra_config`` and offsets the first two per rank by
    ``get_port_offset(fold_local_rank(data_parallel_rank, data_parallel_size_local), tp_rank)``
    (``moriio_common``). An external-LB rank runs with ``data_parallel_size_local`` 1, so its
    rank folds to 0: each launcher binds ``base + tp_rank``, whatever its DP rank. Infera
    reserves ``tp`` consecutive free ports for each (one block of ``2 * tp``; a port the user
    set is kept), records ``dp_size_local`` 1 (peers fold this worker's ranks the same way),
    sets ``http_port`` to the engine's port, ``host_ip`` to the advertised host and leaves
    ``proxy_ip`` empty (no toy-proxy heartbeat: the worker registers in discovery instead).
    """

    engine = ENGINE
    name = "moriio"
    native = ("MoRIIOConnector",)
    description = "vLLM MoRIIOConnector (MoRI-IO RDMA; router protocol vllm-moriio, or vllm-moriio-read)"

    def build(self, ctx: LaunchContext, user: dict[str, Any]) -> TransferPlan:
        role = ctx.role
        # MoRIIO is a producer only with kv_role kv_producer (kv_both would make a consumer)
        config = _base_config(ctx, user, "MoRIIOConnector", ONE_SIDED[role])
        extra = extra_config(user)
        rank, size = _dp(ctx)
        tp = _tp(ctx)
        http_port = extra.get("http_port", ctx.port)
        if int(http_port) != ctx.port:
            raise EngineError(
                f"--kv-transfer-config kv_connector_extra_config.http_port {http_port}: MoRIIO needs "
                f"the engine's HTTP port ({ctx.port}); leave it out"
            )
        # one block of 2 * tp consecutive free ports: handshake ranks, then notify ranks
        block = free_ports(ctx, 2 * tp, consecutive=True)[0] if not all(extra.get(k) for k in KEYS) else 0
        ports = {key: int(extra[key]) if extra.get(key) else block + i * tp for i, key in enumerate(KEYS)}
        host = str(extra.get("host_ip") or ctx.advertise_host)
        extra.update(ports, http_port=ctx.port, host_ip=host)
        extra.setdefault("proxy_ip", "")
        extra.setdefault("proxy_ping_port", 0)
        config["kv_connector_extra_config"] = extra
        read = str(extra.get("read_mode", "false")).strip().lower() in MORIIO_READ_VALUES
        params = {
            "engine_id": f"{host}:{ports['handshake_port']}",
            "host": host,
            "handshake_port": ports["handshake_port"],
            "notify_port": ports["notify_port"],
            "tp_size": tp,
            "dp_size": size,
            "dp_size_local": MORIIO_DP_SIZE_LOCAL,
            "dp_rank": rank,
        }
        pd = PdInfo(protocol="vllm-moriio-read" if read else "vllm-moriio", params=params)
        return TransferPlan(engine=ENGINE, role=role, connector=self.name, config=config, pd=pd)


class MultiConnector:
    """MultiConnector: exactly one PD connector among ``kv_connector_extra_config.connectors``,
    composed with others (OffloadingConnector, LMCacheConnectorV1…) that Infera leaves as given.
    The PD child is built by its own connector; the router speaks its protocol."""

    engine = ENGINE
    name = "multi"
    native = ("MultiConnector",)
    description = "vLLM MultiConnector (one PD connector + e.g. offloading; the PD child's protocol)"

    def build(self, ctx: LaunchContext, user: dict[str, Any]) -> TransferPlan:
        extra = extra_config(user)
        children, index, connector = one_pd_child(
            ctx,
            ENGINE,
            BUILTIN,
            extra.get("connectors"),
            multi=self.name,
            label="MultiConnector",
            field="kv_connector_extra_config.connectors",
            example='[{"kv_connector":"NixlConnector"},{"kv_connector":"OffloadingConnector",'
            '"kv_connector_extra_config":{"cpu_bytes_to_use":1e9}}]',
        )
        child = children[index]
        plan = connector.build(ctx, child)
        composed = []
        for i, c in enumerate(children):
            if i == index:
                # vLLM passes the parent's engine_id to each child itself (a second one is an error)
                composed.append({k: v for k, v in plan.config.items() if k != "engine_id"})
            else:
                composed.append({"kv_role": "kv_both", **c})
        outer = {k: v for k, v in user.items() if k != "kv_connector_extra_config"}
        config = _base_config(ctx, outer, "MultiConnector", (plan.config["kv_role"],))
        config["kv_connector_extra_config"] = {**extra, "connectors": composed}
        return TransferPlan(
            engine=ENGINE, role=ctx.role, connector=self.name, config=config, env=plan.env, pd=plan.pd
        )


BUILTIN: tuple[TransferConnector, ...] = (
    NixlConnector(),
    MooncakeConnector(),
    MoriioConnector(),
    MultiConnector(),
)


def transfer_plan(ctx: LaunchContext) -> TransferPlan:
    """This launch's vLLM transfer plan (built once; plugins amend it).

    KV offloading (:mod:`infera_vllm.offload`) comes first: on a mixed worker it adds vLLM's
    offloading flags, on prefill/decode it turns the request into a MultiConnector.
    """
    if ctx.kv_transfer is not None:
        return ctx.kv_transfer
    user = parse_user_config(ctx.options.get("kv_transfer_config"))
    chosen = str(ctx.options.get("pd_connector") or "nixl")
    pd_class: str | None = "NixlConnector"
    if ctx.role is not Role.MIXED and user.get("kv_connector") is None:
        # the PD child offloading would compose with: an unknown --pd-connector is one line here,
        # a plugin's connector without a vLLM class of its own (native=()) has none (None)
        pd = find_connector(connectors_for(ctx, ENGINE, BUILTIN), ENGINE, native=None, chosen=chosen)
        pd_class = pd.native[0] if pd.native else None
    offloading = plan_offload(ctx, user, pd_class, pd_name=chosen)
    user = offloading.config
    mixed = None
    if ctx.role is Role.MIXED:
        check_one_sided_mixed(user)
        # the user's own connector (e.g. offloading) on a mixed worker, unchanged
        mixed = TransferPlan(
            engine=ENGINE, role=ctx.role, connector=None, config=user, flags=offloading.flags
        )
    plan = resolve_plan(ctx, ENGINE, BUILTIN, chosen=chosen, user=user, mixed=mixed)
    for key, value in offloading.env.items():  # LMCACHE_CONFIG_FILE; a plugin's amendment wins
        plan.env.setdefault(key, value)
    return plan

"""ATOM KV transfer connectors (``--kv-transfer-config``) for prefill/decode workers.

ATOM's ``mooncake`` connector binds one ZMQ side channel per rank at
``handshake_port + pp_rank * dp_size * tp_size + dp_rank * tp_size + tp_rank``
(``atom/kv_transfer/disaggregation/port_offset.py``), its ``moriio`` connector at
``handshake_port + dp_rank * tp_size + tp_rank`` (``moriio_common.get_port_offset``), and the peer
computes the same offsets from the advertised ``handshake_port``. Infera therefore reserves
``tp × dp × pp`` consecutive free ports (one per rank; ATOM's ``-dp``/``-pp`` after ``--``)
and passes the first as ``handshake_port``;
``http_port`` is the server port (ATOM: it must equal ``--server-port``). ``multi``
(ATOM's MultiConnector: ``connectors`` at the top level, e.g. mooncake + ``lmcache_offload``)
takes exactly one PD child. The user's ``--kv-transfer-config`` keys (``protocol``,
``ib_device``, ``qp_per_transfer``…) are kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infera_atom.parallel import engine_size
from infera_core.engines.support import free_ports
from infera_core.engines.transfer import (
    TransferConnector,
    TransferPlan,
    check_kv_role,
    check_one_sided_mixed,
    one_pd_child,
    parse_user_config,
    resolve_plan,
)
from infera_core.errors import EngineError
from infera_core.worker import PdInfo, Role

if TYPE_CHECKING:
    from infera_core.engines.base import LaunchContext

ENGINE = "atom"
DEFAULT_CONNECTOR = "mooncake"
KV_ROLE = {Role.PREFILL: ("kv_producer",), Role.DECODE: ("kv_consumer",)}
HANDSHAKE_KEY = "atom_handshake"


def handshake_ports(ctx: LaunchContext, user: dict[str, Any]) -> list[int]:
    """One side-channel port per rank (``tp × dp × pp`` of them, ATOM's offsets): from the
    user's ``handshake_port`` (config or ``--handshake-port``) onwards, or consecutive free ones.
    The first is picked once per launch (``ctx.ports["atom_handshake"]``)."""
    tp = int(ctx.options.get("tp") or 1)
    count = tp * engine_size(ctx, "dp") * engine_size(ctx, "pp")
    first = ctx.ports.get(HANDSHAKE_KEY)
    if first is None:
        wanted = int(user.get("handshake_port") or ctx.options.get("handshake_port") or 0)
        first = ctx.ports[HANDSHAKE_KEY] = wanted or free_ports(ctx, count, consecutive=True)[0]
    return [first + rank for rank in range(count)]


class _AtomConnector:
    engine = ENGINE
    name = ""
    protocol = ""

    @property
    def native(self) -> tuple[str, ...]:
        return (self.name,)

    def build(self, ctx: LaunchContext, user: dict[str, Any]) -> TransferPlan:
        kv_role = check_kv_role(user, ctx.role, KV_ROLE[ctx.role], self.name) or KV_ROLE[ctx.role][0]
        if int(user.get("http_port", ctx.port)) != ctx.port:
            raise EngineError(
                f"--kv-transfer-config http_port {user['http_port']}: ATOM needs the server port "
                f"({ctx.port}); leave it out"
            )
        ports = handshake_ports(ctx, user)
        config = {
            **user,
            "kv_connector": self.name,
            "kv_role": kv_role,
            "handshake_port": ports[0],
            "http_port": ctx.port,
        }
        tp = int(ctx.options.get("tp") or 1)
        pd = PdInfo(protocol=self.protocol, params={"handshake_port": ports[0], "tp_size": tp})
        return TransferPlan(engine=ENGINE, role=ctx.role, connector=self.name, config=config, pd=pd)


class AtomMooncake(_AtomConnector):
    """ATOM's ``mooncake`` connector (router protocol ``atom-mooncake``)."""

    name = "mooncake"
    protocol = "atom-mooncake"
    description = "ATOM Mooncake connector (handshake side channel per TP rank)"


class AtomMoriio(_AtomConnector):
    """ATOM's ``moriio`` connector (MoRI-IO RDMA reads by the decode; protocol ``atom-moriio``)."""

    name = "moriio"
    protocol = "atom-moriio"
    description = "ATOM MoRI-IO connector (RDMA reads; handshake side channel per TP rank)"


class AtomMulti:
    """ATOM's ``multi`` connector: exactly one PD child among ``connectors`` (e.g. mooncake +
    ``lmcache_offload``); the PD child is built by its connector, the others pass as given."""

    engine = ENGINE
    name = "multi"
    native = ("multi",)
    description = "ATOM MultiConnector (one PD connector + e.g. lmcache_offload)"

    def build(self, ctx: LaunchContext, user: dict[str, Any]) -> TransferPlan:
        children, index, connector = one_pd_child(
            ctx,
            ENGINE,
            BUILTIN,
            user.get("connectors"),
            multi=self.name,
            label="multi",
            field="connectors",
            example='[{"kv_connector":"mooncake"},{"kv_connector":"lmcache_offload","kv_role":"offload"}]',
        )
        check_kv_role(user, ctx.role, KV_ROLE[ctx.role], "multi")  # ATOM reads an outer kv_role first
        plan = connector.build(ctx, children[index])
        composed = [plan.config if i == index else c for i, c in enumerate(children)]
        config = {**user, "kv_connector": "multi", "connectors": composed}
        return TransferPlan(engine=ENGINE, role=ctx.role, connector=self.name, config=config, pd=plan.pd)


BUILTIN: tuple[TransferConnector, ...] = (AtomMooncake(), AtomMoriio(), AtomMulti())


def transfer_plan(ctx: LaunchContext) -> TransferPlan:
    """This launch's ATOM transfer plan (built once; plugins amend it)."""
    user = parse_user_config(ctx.options.get("kv_transfer_config"))
    mixed = None
    if ctx.role is Role.MIXED:
        check_one_sided_mixed(user)
        for child in user.get("connectors") or []:
            if isinstance(child, dict):
                check_one_sided_mixed(child)
        mixed = TransferPlan(engine=ENGINE, role=ctx.role, connector=None, config=user)
    chosen = str(ctx.options.get("pd_connector") or DEFAULT_CONNECTOR)
    return resolve_plan(ctx, ENGINE, BUILTIN, chosen=chosen, user=user, mixed=mixed)

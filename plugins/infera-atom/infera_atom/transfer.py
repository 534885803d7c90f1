"""ATOM KV transfer connectors (``--kv-transfer-config``) for prefill/decode workers.

ATOM's ``mooncake`` connector binds one ZMQ side channel per rank at
``handshake_port + pp_rank * dp_size * tp_size + dp_rank * tp_size + tp_rank``
(``atom/kv_transfer/disaggregation/port_offset.py``), and the peer computes the same
offsets from the advertised ``handshake_port``. Infera therefore reserves ``tp``
consecutive free ports (one per TP rank) and passes the first as ``handshake_port``;
``http_port`` is the server port (ATOM: it must equal ``--server-port``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infera_core.engine_support import free_ports
from infera_core.transfer import TransferConnector, TransferPlan, check_kv_role, resolve_plan
from infera_core.worker import PdInfo, Role

if TYPE_CHECKING:
    from infera_core.engine import LaunchContext

ENGINE = "atom"
KV_ROLE = {Role.PREFILL: ("kv_producer",), Role.DECODE: ("kv_consumer",)}


def handshake_ports(ctx: LaunchContext) -> list[int]:
    """One side-channel port per TP rank: the user's ``--handshake-port`` onwards, or free ones."""
    tp = int(ctx.options.get("tp") or 1)
    wanted = int(ctx.options.get("handshake_port") or 0)
    if wanted:
        return [wanted + rank for rank in range(tp)]
    return free_ports(ctx, tp, consecutive=True)


class AtomMooncake:
    """ATOM's ``mooncake`` connector (router protocol ``atom-mooncake``)."""

    engine = ENGINE
    name = "mooncake"
    native = ("mooncake",)
    description = "ATOM Mooncake connector (handshake side channel per TP rank)"

    def build(self, ctx: LaunchContext, user: dict[str, Any]) -> TransferPlan:
        kv_role = check_kv_role(user, ctx.role, KV_ROLE[ctx.role], "mooncake") or KV_ROLE[ctx.role][0]
        ports = handshake_ports(ctx)
        config = {
            **user,
            "kv_connector": "mooncake",
            "kv_role": kv_role,
            "handshake_port": ports[0],
            "http_port": ctx.port,
        }
        params = {"handshake_port": ports[0], "tp_size": len(ports)}
        pd = PdInfo(protocol="atom-mooncake", params=params)
        return TransferPlan(engine=ENGINE, role=ctx.role, connector=self.name, config=config, pd=pd)


BUILTIN: tuple[TransferConnector, ...] = (AtomMooncake(),)


def transfer_plan(ctx: LaunchContext) -> TransferPlan:
    """This launch's ATOM transfer plan (built once; plugins amend it)."""
    return resolve_plan(ctx, ENGINE, BUILTIN, chosen="mooncake", user={})

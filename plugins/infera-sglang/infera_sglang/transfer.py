"""SGLang KV transfer backends (``--disaggregation-transfer-backend``) for prefill/decode workers.

Each value SGLang accepts for PD (``mooncake``, ``nixl``, ``mori`` — AMD MoRI-IO —,
``mooncake_tcp``, ``ascend``) is an :class:`infera_core.engines.transfer.TransferConnector`. All
of them hand KV over through SGLang's common bootstrap server on the prefill
(``--disaggregation-bootstrap-port``), so the router speaks ``sglang-bootstrap`` to each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infera_core.engines.support import free_ports
from infera_core.engines.transfer import TransferConnector, TransferPlan, resolve_plan
from infera_core.worker import PdInfo, Role

if TYPE_CHECKING:
    from infera_core.engines.base import LaunchContext

ENGINE = "sglang"
DEFAULT_BACKEND = "mooncake"


class SglangBackend:
    """One ``--disaggregation-transfer-backend`` value."""

    engine = ENGINE

    def __init__(self, name: str, description: str) -> None:
        self.name = name
        self.native = (name,)
        self.description = description

    def build(self, ctx: LaunchContext, user: dict[str, Any]) -> TransferPlan:
        flags = ["--disaggregation-mode", ctx.role.value, "--disaggregation-transfer-backend", self.name]
        params: dict[str, Any] = {"transfer_backend": self.name, "tp_size": int(ctx.options.get("tp") or 1)}
        if ctx.role is Role.PREFILL:
            port = free_ports(ctx)[0]
            flags += ["--disaggregation-bootstrap-port", str(port)]
            params["bootstrap_host"] = ctx.advertise_host
            params["bootstrap_port"] = port
        pd = PdInfo(protocol="sglang-bootstrap", params=params)
        return TransferPlan(engine=ENGINE, role=ctx.role, connector=self.name, flags=flags, pd=pd)


BUILTIN: tuple[TransferConnector, ...] = (
    SglangBackend("mooncake", "Mooncake transfer engine (RDMA)"),
    SglangBackend("nixl", "NVIDIA NIXL"),
    SglangBackend("mori", "AMD MoRI-IO (RDMA on ROCm)"),
    SglangBackend("mooncake_tcp", "Mooncake over TCP"),
    SglangBackend("ascend", "Ascend NPUs"),
)


def transfer_plan(ctx: LaunchContext) -> TransferPlan:
    """This launch's SGLang transfer plan (built once; plugins amend it)."""
    chosen = str(ctx.options.get("transfer_backend") or DEFAULT_BACKEND)
    return resolve_plan(ctx, ENGINE, BUILTIN, chosen=chosen, user={}, option="--transfer-backend")

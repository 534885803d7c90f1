"""SGLang's KV transfer connectors pass the contract kit third-party connectors use
(``infera_core.testing.transfer_contract``)."""

from __future__ import annotations

from infera_sglang.transfer import BUILTIN as SGLANG

from infera_core.testing.transfer_contract import TransferConnectorContract


class TestSglangMori(TransferConnectorContract):
    connector = next(c for c in SGLANG if c.name == "mori")

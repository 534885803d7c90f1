"""vLLM's KV transfer connectors pass the contract kit third-party connectors use
(``infera_core.testing.transfer_contract``)."""

from __future__ import annotations

from typing import Any, ClassVar

from infera_vllm.transfer import MooncakeConnector, MoriioConnector, MultiConnector, NixlConnector

from infera_core.testing.transfer_contract import TransferConnectorContract

OFFLOAD = {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {"cpu_bytes_to_use": 1000000}}


class TestVllmNixl(TransferConnectorContract):
    connector = NixlConnector()


class TestVllmMooncake(TransferConnectorContract):
    connector = MooncakeConnector()


class TestVllmMoriio(TransferConnectorContract):
    connector = MoriioConnector()
    options: ClassVar[dict[str, Any]] = {"tp": 4, "dp_size": 2, "dp_rank": 1}


class TestVllmMulti(TransferConnectorContract):
    connector = MultiConnector()
    user: ClassVar[dict[str, Any]] = {
        "kv_connector": "MultiConnector",
        "kv_connector_extra_config": {"connectors": [{"kv_connector": "MoRIIOConnector"}, OFFLOAD]},
    }

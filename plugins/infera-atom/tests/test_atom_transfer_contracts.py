"""ATOM's KV transfer connectors pass the contract kit third-party connectors use
(``infera_core.testing.transfer_contract``)."""

from __future__ import annotations

from typing import Any, ClassVar

from infera_atom.transfer import AtomMooncake, AtomMoriio, AtomMulti

from infera_core.testing.transfer_contract import TransferConnectorContract


class TestAtomMooncake(TransferConnectorContract):
    connector = AtomMooncake()


class TestAtomMoriio(TransferConnectorContract):
    connector = AtomMoriio()


class TestAtomMulti(TransferConnectorContract):
    connector = AtomMulti()
    user: ClassVar[dict[str, Any]] = {
        "kv_connector": "multi",
        "connectors": [
            {"kv_connector": "mooncake"},
            {"kv_connector": "lmcache_offload", "kv_role": "offload"},
        ],
    }

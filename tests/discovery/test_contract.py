"""The built-in backends pass the discovery contract suite plugin authors get."""

from __future__ import annotations

import pytest

from infera_core.discovery.base import Discovery, DiscoverySettings
from infera_core.discovery.etcd import EtcdDiscovery
from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.testing.contracts import EngineAdapterContract
from infera_core.testing.discovery_contract import DiscoveryContract
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.standin_plugin import StandinAdapter


class TestMemoryBackend(DiscoveryContract):
    @pytest.fixture(autouse=True)
    def _store(self) -> None:
        self.store = MemoryStore()

    async def make_discovery(self) -> Discovery:
        return MemoryDiscovery(self.store)


@pytest.mark.etcd
class TestEtcdBackend(DiscoveryContract):
    @pytest.fixture(autouse=True)
    def _etcd(self, etcd_server: EtcdServer) -> None:
        self.settings = DiscoverySettings(etcd_endpoints=[etcd_server.url], lease_ttl=5)

    async def make_discovery(self) -> Discovery:
        return EtcdDiscovery(self.settings)


class TestStandinAdapter(EngineAdapterContract):
    adapter = StandinAdapter()

"""The built-in backends pass the discovery contract suite plugin authors get."""

from __future__ import annotations

import pytest

from infera_core.config.backends import BackendOptions
from infera_core.discovery.base import Discovery, DiscoverySettings
from infera_core.discovery.etcd import EtcdDiscovery
from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.testing.contracts import EngineAdapterContract
from infera_core.testing.discovery_contract import DiscoveryContract
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.standin_plugin import StandinAdapter
from infera_core.util.nats_server import NatsServer

try:  # the infera-nats plugin's backend, when that distribution is installed
    from infera_nats.discovery import NatsDiscovery
    from infera_nats.settings import NatsSettings
except ImportError:  # pragma: no cover - infera-core alone
    NatsDiscovery = NatsSettings = None  # type: ignore[assignment,misc]


class TestMemoryBackend(DiscoveryContract):
    @pytest.fixture(autouse=True)
    def _store(self) -> None:
        self.store = MemoryStore()

    async def make_discovery(self) -> Discovery:
        return MemoryDiscovery(self.store)


class _ServerBackend(DiscoveryContract):
    """A backend whose server process the contract stops and starts (its outage checks)."""

    server: EtcdServer | NatsServer

    def stop_backend(self) -> None:
        self.server.stop()

    def start_backend(self) -> None:
        self.server.start()


@pytest.mark.etcd
class TestEtcdBackend(_ServerBackend):
    lease_ttl = 3.0

    @pytest.fixture(autouse=True)
    def _etcd(self, etcd_server: EtcdServer) -> None:
        self.server = etcd_server
        self.settings = DiscoverySettings(etcd_endpoints=[etcd_server.url], lease_ttl=self.lease_ttl)

    async def make_discovery(self) -> Discovery:
        return EtcdDiscovery(self.settings)


@pytest.mark.skipif(NatsDiscovery is None, reason="infera-nats is not installed")
class TestNatsBackend(_ServerBackend):
    """JetStream key-value discovery (the ``infera-nats`` plugin) against a real nats-server."""

    lease_ttl = 2.0

    @pytest.fixture(autouse=True)
    def _nats(self, nats_server: NatsServer) -> None:
        self.server = nats_server
        options = BackendOptions(given=[NatsSettings(nats_url=nats_server.url)])
        self.settings = DiscoverySettings(lease_ttl=self.lease_ttl, connect_timeout=3, options=options)

    async def make_discovery(self) -> Discovery:
        return NatsDiscovery(self.settings)


class TestStandinAdapter(EngineAdapterContract):
    adapter = StandinAdapter()

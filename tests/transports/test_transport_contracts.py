"""Core's transports (and the NATS plugin's, when installed) pass the contract suites plugin authors get."""

from __future__ import annotations

import pytest

from infera_core.builtin.transports import HttpRequestTransport, ZmqKvEventTransport
from infera_core.config.backends import BackendOptions
from infera_core.testing.contracts import KvEventTransportContract, RequestTransportContract
from infera_core.util.nats_server import NatsServer

try:
    from infera_nats.settings import NatsSettings
    from infera_nats.transport_factories import NatsKvEventTransport, NatsRequestTransport
except ImportError:  # pragma: no cover - infera-core alone
    NatsSettings = None  # type: ignore[assignment,misc]

needs_nats = pytest.mark.skipif(NatsSettings is None, reason="infera-nats is not installed")


class TestHttpRequestTransport(RequestTransportContract):
    factory = HttpRequestTransport()


class TestZmqKvEventTransport(KvEventTransportContract):
    factory = ZmqKvEventTransport()


class _OnNats:
    @pytest.fixture(autouse=True)
    def _nats(self, nats_server: NatsServer) -> None:
        self.nats_url = nats_server.url

    def options(self) -> BackendOptions:
        return BackendOptions(given=[NatsSettings(nats_url=self.nats_url)])


@needs_nats
class TestNatsRequestTransport(_OnNats, RequestTransportContract):
    factory = NatsRequestTransport() if NatsSettings is not None else None


@needs_nats
class TestNatsKvEventTransport(_OnNats, KvEventTransportContract):
    factory = NatsKvEventTransport() if NatsSettings is not None else None

"""Request transports, KV-event transports and backend settings are plugins like engines."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from pydantic import Field

from infera_core.cli import build_cli
from infera_core.config.backends import BackendOptions
from infera_core.config.settings import InferaSettings
from infera_core.discovery.base import Discovery, DiscoveryRegistry, DiscoverySettings
from infera_core.errors import DuplicateNameError, InferaError, UnknownNameError
from infera_core.launcher.transports import WorkerTransports
from infera_core.plugin.spec import hookimpl
from infera_core.scheduling.types import Endpoint
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for, until
from infera_core.testing.upstream import fake_upstreams, record_for
from infera_core.transports.base import (
    ClientContext,
    KvEventSource,
    KvEventTransportRegistry,
    KvSourceContext,
    RequestTransportRegistry,
    WorkerAttachment,
    WorkerContext,
)
from infera_core.transports.clients import KvSources, Upstreams
from infera_core.transports.http import make_upstream
from infera_core.transports.upstreams import Upstream, UpstreamResponse
from infera_core.worker import WorkerRecord

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


class PigeonSettings(InferaSettings):
    pigeon_loft: str = Field("roof", description="Where the pigeons live.")
    pigeon_speed: int = Field(3, ge=1, description="Pigeons per second.")


class Counting:
    """An HTTP client that counts what it carries (stands in for a plugin transport's client)."""

    def __init__(self, inner: Upstream) -> None:
        self.inner = inner
        self.opened: list[str] = []
        self.started = False

    async def start(self) -> None:
        self.started = True
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def open(
        self, endpoint: Endpoint, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> UpstreamResponse:
        self.opened.append(endpoint.worker_id)
        return await self.inner.open(endpoint, path, body, headers)


class PigeonAttachment:
    def __init__(self, ctx: WorkerContext) -> None:
        self.record_fields: dict[str, Any] = {"request_params": {"loft": ctx.worker_id}}
        self.closed = False

    async def close(self) -> None:
        self.closed = True


class PigeonTransport:
    name = "pigeon"
    description = "Requests by pigeon."
    settings_model = PigeonSettings

    def __init__(self) -> None:
        self.clients: list[Counting] = []
        self.contexts: list[ClientContext] = []

    def create_client(self, ctx: ClientContext) -> Upstream:
        self.contexts.append(ctx)
        client = Counting(
            make_upstream(
                "native", connect_timeout=2, first_byte_timeout=5, idle_timeout=5, max_connections=8
            )
        )
        self.clients.append(client)
        return client

    async def attach_worker(self, ctx: WorkerContext) -> WorkerAttachment | None:
        return PigeonAttachment(ctx)


class PigeonKvEvents:
    name = "pigeon"
    description = "KV events by pigeon."
    settings_model = PigeonSettings  # shared with the request transport: one set of flags

    def create_source(self, ctx: KvSourceContext) -> KvEventSource | None:
        raise NotImplementedError

    async def attach_worker(self, ctx: WorkerContext) -> WorkerAttachment | None:
        return None


class PigeonDiscovery:
    name = "pigeon"
    description = "Workers announced by pigeon."
    settings_model = PigeonSettings

    def __init__(self) -> None:
        self.seen: list[PigeonSettings] = []

    def create(self, settings: DiscoverySettings) -> Discovery:
        self.seen.append(settings.options.get(PigeonSettings))
        raise NotImplementedError("pigeons are not implemented")


class PigeonPlugin:
    def __init__(self) -> None:
        self.transport = PigeonTransport()
        self.discovery = PigeonDiscovery()

    @hookimpl
    def infera_register_request_transports(self, registry: RequestTransportRegistry) -> None:
        registry.add(self.transport)

    @hookimpl
    def infera_register_kv_event_transports(self, registry: KvEventTransportRegistry) -> None:
        registry.add(PigeonKvEvents())

    @hookimpl
    def infera_register_discovery_backends(self, registry: DiscoveryRegistry) -> None:
        registry.add(self.discovery)


def test_core_registers_http_and_zmq_like_a_plugin_and_plugins_add_theirs() -> None:
    hooks = make_hooks(("pigeon", PigeonPlugin()))
    catalog = hooks.catalog()
    assert {"http", "pigeon"} <= set(catalog.request_transports.names())  # (+ installed plugins')
    assert {"pigeon", "zmq"} <= set(catalog.kv_event_transports.names())
    assert catalog.request_transports.owner_of("http") == "core"
    provides = catalog.provides()
    assert provides["pigeon"]["request_transports"] == ["pigeon"]
    assert provides["core"]["kv_event_transports"] == ["zmq"]
    assert hooks.require("request_transport", "pigeon") is catalog.request_transports.get("pigeon")
    with pytest.raises(UnknownNameError, match=r"carrier.*http.*pigeon"):
        hooks.require("request_transport", "carrier")


class TransportOnly:
    @hookimpl
    def infera_register_request_transports(self, registry: RequestTransportRegistry) -> None:
        registry.add(PigeonTransport())


def test_a_transport_name_registered_twice_names_both_plugins() -> None:
    hooks = make_hooks(("one", TransportOnly()), ("two", TransportOnly()), installed=False)
    with pytest.raises(
        DuplicateNameError, match=r"request transport 'pigeon' is registered twice.*'two'.*'one'"
    ):
        hooks.catalog()


@pytest.mark.parametrize("command", [["serve"], ["workers"], ["up"], ["worker", "standin"]])
def test_plugin_settings_are_flags_with_env_vars_in_help(command: list[str]) -> None:
    hooks = make_hooks(("pigeon", PigeonPlugin()), ("standin", "infera_core.testing.standin_plugin"))
    out = CliRunner().invoke(build_cli(hooks), [*command, "--help"], terminal_width=200).output
    assert "--pigeon-loft TEXT" in out and "INFERA_PIGEON_LOFT" in out
    assert out.count("--pigeon-speed") == 1  # one model shared by three registrations: one flag
    assert "--discovery-backend, --discovery" in out


def test_plugin_settings_reach_the_backend_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = PigeonPlugin()
    hooks = make_hooks(("pigeon", plugin))
    cli = build_cli(hooks)
    result = CliRunner().invoke(cli, ["workers", "--discovery-backend", "pigeon", "--pigeon-speed", "0"])
    assert str(result.exception) == (
        "--pigeon-speed (env INFERA_PIGEON_SPEED): Input should be greater than or equal to 1 (got 0)"
    )
    monkeypatch.setenv("INFERA_PIGEON_LOFT", "attic")
    result = CliRunner().invoke(cli, ["workers", "--discovery", "pigeon", "--pigeon-speed", "7"])
    assert "pigeons are not implemented" in str(result.exception)
    assert plugin.discovery.seen[-1] == PigeonSettings(pigeon_loft="attic", pigeon_speed=7)


def test_backend_options_without_a_command_read_env_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERA_PIGEON_SPEED", "9")
    assert BackendOptions().get(PigeonSettings) == PigeonSettings(pigeon_loft="roof", pigeon_speed=9)
    given = PigeonSettings(pigeon_loft="shed")
    assert BackendOptions(given=[given]).get(PigeonSettings) is given


async def test_one_router_serves_a_mixed_fleet_through_each_workers_transport(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plugin = PigeonPlugin()
    async with fake_upstreams(3) as ups, serving(settings_for(), make_hooks(("pigeon", plugin))) as srv:
        srv.store.put(record_for(ups[0]))  # http (the default)
        srv.store.put(record_for(ups[1], request_transport="pigeon", request_params={"loft": "w1"}))
        with caplog.at_level(logging.WARNING):
            srv.store.put(record_for(ups[2], request_transport="carrier-owl"))
            await srv.wait_workers(2)
        assert "carrier-owl" in caplog.text and "w2" in caplog.text
        async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
            workers = [
                (await client.post("/v1/chat/completions", json=CHAT)).json()["worker"] for _ in range(6)
            ]
        assert sorted(set(workers)) == ["w0", "w1"]
        (pigeon,) = plugin.transport.clients  # one client per transport, made on first use
        assert pigeon.started and pigeon.opened == ["w1"] * workers.count("w1")
        assert ups[0].requests == workers.count("w0") and ups[2].requests == 0
        # a record that moves to a transport this router lacks leaves the rotation
        srv.store.put(record_for(ups[1], request_transport="carrier-owl"))
        await until(lambda: set(srv.core.table.by_id) == {"w0"})


async def test_launcher_side_attaches_the_transports_and_publishes_their_fields() -> None:
    hooks = make_hooks(("pigeon", PigeonPlugin()))
    with pytest.raises(UnknownNameError, match="request transport 'owl'"):
        WorkerTransports(hooks, "owl", "zmq")
    transports = WorkerTransports(hooks, "pigeon", "pigeon")
    ctx = WorkerContext(worker_id="w9", model="m", engine_url="http://127.0.0.1:1")
    fields = await transports.attach(ctx)
    assert fields == {
        "request_transport": "pigeon",
        "kv_event_transport": "pigeon",
        "request_params": {"loft": "w9"},
    }
    assert await transports.attach(ctx) == fields  # attached once (engine restarts re-register)
    record = WorkerRecord(worker_id="w9", url="http://x", model="m", engine="sim").model_copy(update=fields)
    assert WorkerRecord.from_json(record.to_json()).request_params == {"loft": "w9"}
    (attachment,) = transports.attached
    await transports.close()
    assert isinstance(attachment, PigeonAttachment) and attachment.closed


def test_records_default_to_http_and_zmq_and_keep_unknown_transport_names() -> None:
    old = WorkerRecord.from_json(b'{"worker_id": "a", "url": "http://a", "model": "m", "engine": "sim"}')
    assert (old.request_transport, old.kv_event_transport) == ("http", "zmq")
    new = WorkerRecord.from_json(old.to_json().replace(b'"http"', b'"quic"', 1))
    assert new.request_transport == "quic"


class Unreachable:
    """A transport whose server is down: its client and its KV source fail to start."""

    name = "down"
    description = "Always unreachable."
    settings_model = None

    def create_client(self, ctx: ClientContext) -> Upstream:
        return self  # type: ignore[return-value]

    def create_source(self, ctx: KvSourceContext) -> KvEventSource | None:
        return self  # type: ignore[return-value]

    async def start(self) -> None:
        raise ConnectionError("nobody home at down://1")

    async def close(self) -> None:
        return None

    async def attach_worker(self, ctx: WorkerContext) -> WorkerAttachment | None:
        return None


async def test_a_transport_that_cannot_start_is_one_line_naming_its_flag() -> None:
    requests, kv_events = RequestTransportRegistry(), KvEventTransportRegistry()
    requests.add(Unreachable())  # type: ignore[arg-type]
    kv_events.add(Unreachable())  # type: ignore[arg-type]
    upstreams = Upstreams(requests, ClientContext(), eager=["down"])
    with pytest.raises(InferaError) as err:
        await upstreams.start()
    assert str(err.value) == "--request-transport down: the client did not start: nobody home at down://1"
    sources = KvSources(kv_events, KvSourceContext(replay_timeout=1.0))
    with pytest.raises(InferaError) as err:
        await sources.start(["down"])
    assert str(err.value) == (
        "--kv-event-transport down: the KV event source did not start: nobody home at down://1"
    )
    assert sources.clients == {}  # made again on the next use
    with pytest.raises(UnknownNameError, match="'owl'; available: down"):
        await sources.start(["owl"])
    await sources.close()


class Counted:
    """A source that counts its starts and closes."""

    def __init__(self) -> None:
        self.starts = self.closes = 0

    async def start(self) -> None:
        self.starts += 1

    async def close(self) -> None:
        self.closes += 1

    async def follow(self, record: WorkerRecord, rank: int | None, sink: Any) -> None:
        raise NotImplementedError

    async def replay(
        self, record: WorkerRecord, rank: int | None, start: int, until: int
    ) -> list[tuple[int, bytes]] | None:
        return None


class CountedKvEvents:
    """A KV-event transport making :class:`Counted` sources (or None: the deprecated answer)."""

    description = "Counted."
    settings_model = None

    def __init__(self, name: str, none: bool = False) -> None:
        self.name = name
        self.none = none
        self.made: list[Counted] = []

    def create_source(self, ctx: KvSourceContext) -> KvEventSource | None:
        if self.none:
            return None
        self.made.append(Counted())
        return self.made[-1]

    async def attach_worker(self, ctx: WorkerContext) -> WorkerAttachment | None:
        return None


async def test_kv_sources_are_made_once_per_transport_and_started_before_use() -> None:
    registry = KvEventTransportRegistry()
    counted = CountedKvEvents("counted")
    registry.add(counted)
    sources = KvSources(registry)
    first, again = await asyncio.gather(sources.get("counted"), sources.get("counted"))
    assert first is again is counted.made[0] and len(counted.made) == 1
    assert counted.made[0].starts == 1
    await sources.close()
    assert counted.made[0].closes == 1 and sources.clients == {}


async def test_zmq_is_a_kv_event_source_like_any_other_and_none_still_means_zmq(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from infera_core.transports.zmq import ZmqKvEventSource

    registry = make_hooks().catalog().kv_event_transports
    registry.add(CountedKvEvents("legacy", none=True))
    sources = KvSources(registry)
    zmq_source = await sources.get("zmq")
    assert isinstance(zmq_source, ZmqKvEventSource) and isinstance(zmq_source, KvEventSource)
    legacy = await sources.get("legacy")  # a factory answering None (deprecated): the zmq source
    assert isinstance(legacy, ZmqKvEventSource) and legacy is not zmq_source
    assert "create_source returned None, which is deprecated" in caplog.text
    await sources.close()


class BrokenResponder(PigeonTransport):
    async def attach_worker(self, ctx: WorkerContext) -> WorkerAttachment | None:
        raise ConnectionError("loft unreachable")


class BrokenResponderPlugin:
    @hookimpl
    def infera_register_request_transports(self, registry: RequestTransportRegistry) -> None:
        registry.add(BrokenResponder())


async def test_a_worker_side_that_cannot_start_is_one_line_naming_its_flag() -> None:
    transports = WorkerTransports(make_hooks(("broken", BrokenResponderPlugin())), "pigeon", "zmq")
    ctx = WorkerContext(worker_id="w9", model="m", engine_url="http://127.0.0.1:1")
    with pytest.raises(InferaError) as err:
        await transports.attach(ctx)
    assert str(err.value) == "--request-transport pigeon: the worker side did not start: loft unreachable"

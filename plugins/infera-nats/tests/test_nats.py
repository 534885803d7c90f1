"""NATS JetStream key-value discovery against a real nats-server (beyond the shared contract)."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest
from click.testing import CliRunner

from infera_core.cli import build_cli
from infera_core.config.backends import BackendOptions
from infera_core.discovery.base import ChangeKind, DiscoverySettings
from infera_core.discovery.view import FleetView
from infera_core.errors import DiscoveryError
from infera_core.testing.discovery_contract import contract_record
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import until
from infera_core.util.nats_server import NatsServer
from infera_core.util.net import free_port

nats_discovery = pytest.importorskip("infera_nats.discovery")
NatsSettings = pytest.importorskip("infera_nats.settings").NatsSettings
NatsDiscovery = nats_discovery.NatsDiscovery


def settings(url: str, **kw: object) -> DiscoverySettings:
    values: dict[str, object] = {"lease_ttl": 2.0, "connect_timeout": 3.0}
    values.update(kw)
    return DiscoverySettings(
        options=BackendOptions(given=[NatsSettings(nats_url=url)]),
        **values,  # type: ignore[arg-type]
    )


async def started(s: DiscoverySettings) -> object:
    d = NatsDiscovery(s)
    await d.start()
    return d


@pytest.mark.parametrize("worker_id", ["plain", "sim-127.0.0.1-8001", "10.0.0.5:8000", "ünï/cödé=x", "a..b."])
def test_any_worker_id_is_one_valid_key_and_comes_back(worker_id: str) -> None:
    key = nats_discovery.key_of(worker_id)
    assert all(c.isalnum() or c in "-_=" for c in key) and key.isascii()
    assert nats_discovery.worker_id_of(key) == worker_id


async def test_heartbeats_hold_a_record_past_its_ttl(nats_server: NatsServer) -> None:
    s = settings(nats_server.url, lease_ttl=1.0)
    launcher, router = await started(s), await started(s)
    changes: list[tuple[ChangeKind, str]] = []

    async def collect() -> None:
        async for change in router.watch():  # type: ignore[attr-defined]
            changes.append((change.kind, change.worker_id))

    task = asyncio.ensure_future(collect())
    try:
        reg = await launcher.register(contract_record("held"))  # type: ignore[attr-defined]
        await until(lambda: reg.heartbeats >= 6, within=10)  # two TTLs of refreshes
        assert [r.worker_id for r in await router.list_workers()] == ["held"]  # type: ignore[attr-defined]
        assert changes == [(ChangeKind.PUT, "held")]  # heartbeats are not fleet changes
        await reg.deregister()
        await until(lambda: len(changes) == 2, within=5)
        assert changes[1] == (ChangeKind.DELETE, "held")
    finally:
        task.cancel()
        await launcher.close()  # type: ignore[attr-defined]
        await router.close()  # type: ignore[attr-defined]


async def test_a_record_lost_with_the_nats_state_is_registered_again(tmp_path: object) -> None:
    """NATS restarted without its store (a new pod): the heartbeat puts the record back."""
    port = free_port()
    first = NatsServer(port=port)
    first.start()
    s = settings(first.url, lease_ttl=1.0)
    launcher = await started(s)
    second: NatsServer | None = None
    try:
        reg = await launcher.register(contract_record("phoenix"))  # type: ignore[attr-defined]
        first.close()  # the store goes with it
        second = NatsServer(port=port)
        second.start()
        await until(lambda: reg.recreated > 0, within=15)
        router = await started(s)
        assert [r.worker_id for r in await router.list_workers()] == ["phoenix"]  # type: ignore[attr-defined]
        await router.close()  # type: ignore[attr-defined]
    finally:
        await launcher.close()  # type: ignore[attr-defined]
        first.close()
        if second is not None:
            second.close()


async def test_unreachable_nats_is_one_clear_error_within_the_timeout() -> None:
    dead = f"nats://127.0.0.1:{free_port()}"
    disc = NatsDiscovery(settings(dead, connect_timeout=1.5))
    t0 = time.monotonic()
    with pytest.raises(DiscoveryError) as err:
        await disc.start()
    assert time.monotonic() - t0 < 4
    message = str(err.value)
    assert "\n" not in message and dead in message and "--nats-url" in message


async def test_credentials_in_the_url_are_not_printed() -> None:
    dead = f"nats://alice:s3cret@127.0.0.1:{free_port()}"
    with pytest.raises(DiscoveryError) as err:
        await NatsDiscovery(settings(dead, connect_timeout=1.0)).start()
    assert "s3cret" not in str(err.value)


async def test_malformed_record_is_logged_with_its_key_and_skipped(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    s = settings(nats_server.url)
    writer, router = await started(s), await started(s)
    try:
        kv = await writer.bucket()  # type: ignore[attr-defined]
        await kv.put("broken", b'{"worker_id": "broken", "url": ""}')
        await kv.put("impostor", contract_record("someone-else").to_json())
        await writer.register(contract_record("good"))  # type: ignore[attr-defined]
        with caplog.at_level(logging.WARNING, logger="infera.discovery"):
            view = FleetView(router)  # type: ignore[arg-type]
            await view.start()
            assert set(view.workers) == {"good"}
            await kv.put("late", b"not json")
            await writer.register(contract_record("after"))  # type: ignore[attr-defined]
            await view.wait_for(lambda v: "after" in v.workers, within=5)
            await view.stop()
        assert set(view.workers) == {"good", "after"}
        assert "infera-workers/broken" in caplog.text and "infera-workers/late" in caplog.text
        assert "infera-workers/impostor" in caplog.text
    finally:
        await writer.close()  # type: ignore[attr-defined]
        await router.close()  # type: ignore[attr-defined]


async def test_workers_command_lists_the_fleet(nats_server: NatsServer) -> None:
    s = settings(nats_server.url, lease_ttl=10.0)
    launcher = await started(s)
    try:
        await launcher.register(contract_record("w1", request_transport="nats"))  # type: ignore[attr-defined]
        await launcher.register(contract_record("w2"))  # type: ignore[attr-defined]
        cli = build_cli(make_hooks())
        args = ["workers", "--discovery-backend", "nats", "--nats-url", nats_server.url, "--json"]
        result = await asyncio.to_thread(CliRunner().invoke, cli, args)
        assert result.exit_code == 0, result.output
        listed = json.loads(result.output)
        assert [(r["worker_id"], r["request_transport"]) for r in listed] == [("w1", "nats"), ("w2", "http")]
        table = await asyncio.to_thread(CliRunner().invoke, cli, args[:-1], terminal_width=200)
        assert "w1" in table.output and "nats" in table.output
    finally:
        await launcher.close()  # type: ignore[attr-defined]


def test_workers_command_with_nats_down_is_one_line() -> None:
    dead = f"nats://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(
        build_cli(make_hooks()),
        ["workers", "--discovery-backend", "nats", "--nats-url", dead, "--discovery-timeout", "1"],
    )
    assert result.exit_code != 0 and isinstance(result.exception, DiscoveryError)
    assert dead in str(result.exception)

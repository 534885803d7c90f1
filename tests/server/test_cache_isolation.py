"""Tenant-safe KV: the key file's ``cache_isolation``, the ``cache_salt`` the router injects for
engines that honour it, requests hashed from the same salted root as the engines' salted KV
events, and per-key predicted hits on ``/metrics``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infera_core.errors import ConfigError
from infera_core.kv.decode import MsgpackEventDecoder
from infera_core.kv.index import KvIndex
from infera_core.request import RequestContext
from infera_core.scheduling.types import Endpoint
from infera_core.server.keys import KeyRing, Principal
from infera_core.server.tenancy import CacheSalting, combined_salt
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, serving, settings_for
from infera_core.testing.upstream import FakeUpstream
from infera_core.worker import WorkerRecord

SALTED = Path(__file__).resolve().parents[1] / "kv" / "data" / "kv-events-salted.jsonl"
"""Real vLLM 0.32 frames (``tests/kv/record_salted_frames.py``); frame 1: P salted "tenant-a"."""

MODEL = "fake-model"
KEYS: dict[str, Any] = {
    "cache_isolation": "key",
    "keys": [
        {"name": "alice", "key": "sk-alice", "team": "red"},
        {"name": "bob", "key": "sk-bob", "team": "red"},
        {"name": "carol", "key": "sk-carol", "team": "blue"},
    ],
}
P = [1] + [(i * 37) % 4000 + 10 for i in range(99)]  # the recording's prompt


def _salted_index() -> tuple[KvIndex, Any]:
    """An index mirroring one worker that cached P with ``cache_salt="tenant-a"``."""
    payload = bytes.fromhex(json.loads(SALTED.read_text().splitlines()[1])["payload_hex"])
    index = KvIndex()
    view = index.add_view("w", None, 32)
    index.apply(view, MsgpackEventDecoder("vllm").decode_raw(payload))
    return index, view


def _ring(tmp_path: Path, **changes: Any) -> KeyRing:
    path = tmp_path / f"keys-{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump({**KEYS, **changes}))
    return KeyRing(path)


def _principal(ring: KeyRing, key: str) -> Principal:
    principal = ring.lookup(key.encode())
    assert principal is not None
    return principal


def _salts(ring: KeyRing) -> dict[str, str | None]:
    return {name: _principal(ring, f"sk-{name}").cache_salt for name in ("alice", "bob", "carol")}


def test_each_tenant_gets_a_keyed_salt_never_its_name(tmp_path: Path) -> None:
    by_key = _salts(_ring(tmp_path))
    assert len(set(by_key.values())) == 3
    for name, salt in by_key.items():
        assert salt is not None and salt.startswith("infera-") and len(salt) == 39 and name not in salt
    assert _salts(_ring(tmp_path)) == by_key  # another replica reading the same file salts alike
    by_team = _salts(_ring(tmp_path, cache_isolation="team"))
    assert by_team["alice"] == by_team["bob"] != by_team["carol"]
    assert _salts(_ring(tmp_path, cache_isolation="none")) == dict.fromkeys(by_key)
    assert set(_salts(_ring(tmp_path, cache_salt_secret="s3cret-s3cret-s3cret")).values()).isdisjoint(
        by_key.values()
    )
    with pytest.raises(ConfigError, match="cache_isolation"):
        _ring(tmp_path, cache_isolation="everyone")


def _ctx(body: dict[str, Any], principal: Principal | None = None) -> RequestContext:
    ctx = RequestContext("r1", MODEL, "/v1/completions", body, token_ids=list(P))
    ctx.principal = principal
    return ctx


def test_requests_are_hashed_from_the_salted_root_the_engine_events_use() -> None:
    index, view = _salted_index()
    salting = CacheSalting()

    def overlap(ctx: RequestContext) -> float:
        return index.match(ctx.cached_block_hashes(32, index.hash_prompt), [view])[0]

    salted = _ctx({"prompt": "…", "cache_salt": "tenant-a"})
    raw = json.dumps(salted.body).encode()
    assert salting.apply(salted, raw, ["vllm"]) == raw  # a client's salt goes on unchanged
    assert overlap(salted) == 3
    assert overlap(_ctx({"prompt": "…"})) == 0  # not credited to the unsalted prompt
    other = _ctx({"prompt": "…", "cache_salt": "tenant-b"})
    salting.apply(other, raw, ["vllm"])
    assert overlap(other) == 0
    ignored = _ctx({"prompt": "…", "cache_salt": "tenant-a"})
    salting.apply(ignored, raw, ["vllm", "fake"])  # an engine that ignores the salt caches unsalted
    assert ignored.kv_root is None


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[tuple[RunningServer, FakeUpstream]]:
    up = FakeUpstream("v0", MODEL)
    await up.start()
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump(KEYS))
    try:
        async with serving(settings_for(api_key_file=path), make_hooks()) as server:
            yield server, up
    finally:
        await up.stop()


async def _sent(server: RunningServer, up: FakeUpstream, key: str, **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 1, **extra}
    async with httpx.AsyncClient(base_url=server.url) as client:
        r = await client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    sent: dict[str, Any] = json.loads(up.last_body)
    return sent


async def test_the_router_salts_each_tenants_requests_to_vllm(
    fleet: tuple[RunningServer, FakeUpstream], tmp_path: Path
) -> None:
    server, up = fleet
    server.store.put(WorkerRecord(worker_id="v0", url=up.url, model=MODEL, engine="vllm"))
    await server.wait_workers(1)
    salts = _salts(_ring(tmp_path))
    alice = await _sent(server, up, "sk-alice")
    assert alice["cache_salt"] == salts["alice"] and alice["prompt"] == "hello"
    assert (await _sent(server, up, "sk-bob"))["cache_salt"] == salts["bob"]
    # a client's own salt is combined with the tenant's, never used instead of it
    mixed = await _sent(server, up, "sk-alice", cache_salt="mine")
    assert mixed["cache_salt"] == combined_salt(str(salts["alice"]), "mine") not in {"mine", salts["alice"]}
    assert (await _sent(server, up, "sk-bob", cache_salt="mine"))["cache_salt"] != mixed["cache_salt"]
    # /v1/messages goes to the worker's chat route: salted alike, the client's salt kept
    msg = {
        "model": MODEL,
        "max_tokens": 1,
        "cache_salt": "mine",
        "messages": [{"role": "user", "content": "hi"}],
    }
    async with httpx.AsyncClient(base_url=server.url) as client:
        r = await client.post("/v1/messages", json=msg, headers={"x-api-key": "sk-alice"})
    assert r.status_code == 200, r.text
    assert json.loads(up.last_body)["cache_salt"] == mixed["cache_salt"]
    # a salt vLLM would refuse is refused here, as vLLM words it (never silently replaced)
    for bad in ("", 7, "a/b", "x" * 129):
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 1, "cache_salt": bad}
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post("/v1/completions", json=body, headers={"Authorization": "Bearer sk-alice"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text


async def test_engines_that_take_no_salt_get_the_body_unchanged(
    fleet: tuple[RunningServer, FakeUpstream],
) -> None:
    server, up = fleet
    server.store.put(WorkerRecord(worker_id="v0", url=up.url, model=MODEL, engine="fake"))
    await server.wait_workers(1)
    assert "cache_salt" not in await _sent(server, up, "sk-alice")
    assert (await _sent(server, up, "sk-alice", cache_salt=7))["cache_salt"] == 7  # the engine's business


def test_per_key_predicted_hits(tmp_path: Path) -> None:
    index, _ = _salted_index()
    salting = CacheSalting()
    salting.index = index
    ep = Endpoint(WorkerRecord(worker_id="w", url="http://127.0.0.1:1", model=MODEL, engine="vllm"))
    owner = _ctx({"cache_salt": "tenant-a"}, Principal("alice", None))
    salting.apply(owner, b"{}", ["vllm"])
    salting.routed(owner, ep)
    stranger = _ctx({}, Principal("bob", None))
    salting.routed(stranger, ep)
    counts = {labels: child.value for labels, child in salting.tokens.children.items()}
    assert counts == {
        ("alice", "prompt"): 100,
        ("alice", "predicted_cached"): 96,
        ("bob", "prompt"): 100,
        ("bob", "predicted_cached"): 0,
    }

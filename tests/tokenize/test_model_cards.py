"""Model cards end to end on real etcd and the in-process store: a launcher publishes, a router
fetches once per digest, verifies, caches on disk, builds the routing tokenizer, refuses bad
cards and reports workers of one model with another card."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aetcd
import httpx
import pytest

from infera_core.discovery.base import CardStore, DiscoverySettings
from infera_core.discovery.etcd import EtcdDiscovery
from infera_core.discovery.etcd_cards import CHUNK
from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.engines.settings import WorkerSettings
from infera_core.kv.agreement import AgreementCheck
from infera_core.launcher.card import with_engine_tokenize
from infera_core.launcher.runtime import WorkerLauncher
from infera_core.plugin.hooks import InferaHooks
from infera_core.request import RequestContext
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import eventually
from infera_core.testing.tiny_tokenizer import make_tiny_model_dir
from infera_core.tokenize.card import ModelCard, card_files, digest_of
from infera_core.tokenize.cards import ModelCards
from infera_core.tokenize.hf import HfTokenizer
from infera_core.tokenize.service import RoutingTokenizers
from infera_core.worker import ModelCardRef, WorkerRecord


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = make_tiny_model_dir(tmp_path_factory.mktemp("tiny"), vocab=300, sentences=300)
    (d / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    )
    return d


def card_bytes(directory: Path, model: str = "tiny") -> bytes:
    return ModelCard(model=model, files=card_files(directory), served_names=[model], block_size=16).to_bytes()


def rec(
    worker_id: str, data: bytes | None, model: str = "tiny", source: str = "etcd", **kw: object
) -> WorkerRecord:
    card = ModelCardRef(digest=digest_of(data), size=len(data), source=source) if data is not None else None
    return WorkerRecord(
        worker_id=worker_id,
        url=f"http://127.0.0.1:9/{worker_id}",
        model=model,
        engine="vllm",
        model_card=card,
        **kw,
    )


def router(store: CardStore | None, cache: Path, **kw: object) -> RoutingTokenizers:
    tokens = RoutingTokenizers(InferaHooks.load().catalog().tokenizers, cards=ModelCards(store, cache, **kw))  # type: ignore[arg-type]
    return tokens


async def etcd(server: EtcdServer) -> EtcdDiscovery:
    d = EtcdDiscovery(DiscoverySettings(etcd_endpoints=[server.url], lease_ttl=2.0, connect_timeout=2.0))
    await d.start()
    return d


@contextlib.asynccontextmanager
async def sim_worker(
    store: MemoryStore, model: str, model_path: str | None = None
) -> AsyncIterator[WorkerLauncher]:
    """A launcher running the sim engine, registered in ``store``; drained on exit."""
    settings = WorkerSettings(model=model, model_path=model_path, discovery="memory")
    launcher = WorkerLauncher(InferaHooks.load(), "sim", settings, discovery=MemoryDiscovery(store))
    task = asyncio.create_task(launcher.run())
    try:
        await launcher.wait_registered(within=60)
        yield launcher
    finally:
        await launcher.stop()
        await task


def chat(model: str = "tiny") -> RequestContext:
    return RequestContext(
        "r", model, "/v1/chat/completions", {"messages": [{"role": "user", "content": "the a of"}]}
    )


@pytest.mark.etcd
async def test_etcd_card_is_fetched_once_verified_cached_and_tokenizes_as_the_files(
    etcd_server: EtcdServer, tiny_dir: Path, tmp_path: Path
) -> None:
    disc = await etcd(etcd_server)
    try:
        data = card_bytes(tiny_dir)
        await disc.put_card(digest_of(data), data)
        tokens = router(disc, tmp_path / "cards")
        tokens.observe_worker(rec("w1", data))
        tokens.observe_worker(rec("w2", data))  # the same digest: no second fetch
        await eventually(lambda: tokens.tokenizer_for("tiny", quiet=True) is not None, within=20)
        assert tokens.cards.fetches == 1
        assert tokens.card_info("w2") == {"digest": digest_of(data), "status": "in use"}
        ctx = chat()
        await tokens.fill(ctx)
        want = HfTokenizer(tiny_dir).encode_chat(ctx.body["messages"], ctx.body)
        assert ctx.token_ids == want and not ctx.tokenize_failed
        # a second router on the same cache dir reads the disk, not etcd
        again = router(None, tmp_path / "cards")
        again.observe_worker(rec("w1", data))
        await eventually(lambda: again.tokenizer_for("tiny", quiet=True) is not None, within=20)
        assert again.cards.fetches == 0
    finally:
        await disc.close()


@pytest.mark.etcd
async def test_etcd_cards_are_chunked_and_released_with_their_last_worker(etcd_server: EtcdServer) -> None:
    disc = await etcd(etcd_server)
    try:
        big = bytes(range(256)) * (CHUNK * 5 // 2 // 256)  # 2.5 chunks
        digest = digest_of(big)
        reg = await disc.register(rec("w1", big))
        await disc.put_card(digest, big)
        assert await disc.get_card(digest, len(big)) == big
        with pytest.raises(ValueError, match="over the limit"):
            await disc.get_card(digest, len(big) - 1)
        client = aetcd.Client(host="127.0.0.1", port=int(etcd_server.endpoint.rsplit(":", 1)[1]))
        keys = [kv.key for kv in await client.get_prefix(f"/infera/cards/{digest}/".encode())]
        assert len(keys) == 4  # meta + 3 chunks
        await disc.release_card(digest)  # w1 still names it: kept
        assert await disc.get_card(digest, len(big)) == big
        await reg.deregister()
        await disc.release_card(digest)
        assert await disc.get_card(digest, len(big)) is None
        assert not list(await client.get_prefix(b"/infera/cards/"))
        await client.close()
    finally:
        await disc.close()


@pytest.mark.etcd
async def test_a_card_whose_bytes_do_not_match_its_digest_is_refused(
    etcd_server: EtcdServer, tiny_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disc = await etcd(etcd_server)
    try:
        good = card_bytes(tiny_dir)
        forged = good.replace(b'"block_size":16', b'"block_size":32')
        await disc.put_card(digest_of(good), forged)  # stored under the wrong name
        tokens = router(disc, tmp_path / "cards")
        with caplog.at_level(logging.ERROR, "infera.tokenize.cards"):
            tokens.observe_worker(rec("w1", good))
            await eventually(lambda: "failed" in (tokens.card_info("w1") or {}).get("status", ""), within=20)
        assert "digest mismatch" in caplog.text
        assert tokens.tokenizer_for("tiny", quiet=True) is None
        ctx = chat()
        await tokens.fill(ctx)
        assert ctx.tokenize_failed and not (tmp_path / "cards").exists()
    finally:
        await disc.close()


async def test_an_oversized_card_is_refused_before_and_while_fetching(tiny_dir: Path, tmp_path: Path) -> None:
    data = card_bytes(tiny_dir)
    store = MemoryDiscovery(MemoryStore())
    await store.put_card(digest_of(data), data)
    tokens = router(store, tmp_path / "cards", max_bytes=len(data) - 1)
    tokens.observe_worker(rec("w1", data, source="memory"))  # the record says it is too big
    status = (tokens.card_info("w1") or {}).get("status", "")
    assert status.startswith("failed") and "--card-max-bytes" in status
    # a record that understates the size: the store refuses it while fetching
    lying = rec("w2", data, model="other", source="memory").model_copy(
        update={"model_card": ModelCardRef(digest=digest_of(data), size=10, source="memory")}
    )
    tokens.observe_worker(lying)
    await eventually(lambda: "failed" in (tokens.card_info("w2") or {}).get("status", ""), within=20)
    assert "over the limit" in (tokens.card_info("w2") or {})["status"]
    assert tokens.cards.fetches == 0


async def test_workers_of_one_model_with_two_cards_are_reported_not_mixed(
    tiny_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryDiscovery(MemoryStore())
    one, two = card_bytes(tiny_dir), card_bytes(tiny_dir, model="tiny-v2")
    for data in (one, two):
        await store.put_card(digest_of(data), data)
    tokens = router(store, tmp_path / "cards")
    agreement = AgreementCheck(tokens)
    first, second = rec("w1", one, source="memory"), rec("w2", two, source="memory")
    with caplog.at_level(logging.WARNING):
        for r in (first, second):
            tokens.observe_worker(r)
            agreement.check(r)
    assert agreement.flags.get("w1") is None
    assert any("model_card" in reason for reason in agreement.flags["w2"])
    assert "workers publish different model cards" in caplog.text
    await eventually(lambda: tokens.tokenizer_for("tiny", quiet=True) is not None, within=20)
    assert (tokens.card_info("w2") or {})["status"].startswith("not used")
    assert tokens.cards.fetches == 1


async def test_the_launcher_publishes_its_models_card_and_releases_it(tiny_dir: Path) -> None:
    store = MemoryStore()
    async with sim_worker(store, "tiny", str(tiny_dir)) as launcher:
        record = launcher.record
        assert record is not None and record.model_card is not None
        assert record.model_card.source == "memory"
        digest = record.model_card.digest
        await eventually(lambda: digest in store.cards, 20)
        card = ModelCard.from_bytes(store.cards[digest], digest)
        assert card.files["tokenizer.json"] == (tiny_dir / "tokenizer.json").read_text()
        assert "chat_template.jinja" in card.files and card.served_names == ["tiny"]
        assert card.block_size == (record.kv_events.block_size if record.kv_events else None)
    assert store.cards == {}


async def test_a_worker_without_tokenizer_files_publishes_no_card() -> None:
    store = MemoryStore()
    async with sim_worker(store, "nowhere/none") as launcher:
        assert launcher.record is not None and launcher.record.model_card is None and store.cards == {}


async def test_without_files_the_engines_own_tokenize_gives_the_routing_ids() -> None:
    """The fallback: a worker labelled ``infera.tokenizer=engine`` (the launcher labels one
    whose engine answers ``/tokenize`` when it has no files for a card) tokenizes for routing."""
    async with sim_worker(MemoryStore(), "hub/only") as launcher:
        record, ctx0 = launcher.record, launcher.context
        assert record is not None and ctx0 is not None
        bare = record.model_copy(update={"kv_events": None, "labels": {}})
        async with httpx.AsyncClient(timeout=10) as client:
            labelled = await with_engine_tokenize(ctx0, bare, client)
            assert labelled.labels == {"infera.tokenizer": "engine"}
            # a worker whose tokenizer the router knows (the sim's fingerprint) is left alone
            assert await with_engine_tokenize(ctx0, record, client) == record
            body = {"messages": [{"role": "user", "content": "the a of to and"}]}
            answer = await client.post(f"{record.url}/tokenize", json={"model": "hub/only", **body})
            want = answer.json()["tokens"]
        tokens = RoutingTokenizers(InferaHooks.load().catalog().tokenizers)
        tokens.observe_worker(labelled)
        ctx = RequestContext("r", "hub/only", "/v1/chat/completions", body)
        await tokens.fill(ctx)
        again = RequestContext("r2", "hub/only", "/v1/chat/completions", dict(body))
        await tokens.fill(again)
        assert ctx.token_ids == want and again.token_ids == want and not ctx.tokenize_failed
        assert tokens.counts[("hub/only", "engine")] == 1 and tokens.counts[("hub/only", "cache")] == 1
        tokens.forget_worker(labelled)
        gone = RequestContext("r3", "hub/only", "/v1/completions", {"prompt": "x"})
        await tokens.fill(gone)
        assert gone.tokenize_failed
        await tokens.engine.close()


async def test_router_processes_sharing_a_cache_dir_never_remove_a_card_being_read(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """``serve --processes N`` fetch the same card at once into one cache dir: the second
    writer must not delete the folder the first one is building its tokenizer from."""
    data = card_bytes(tiny_dir)
    store = MemoryDiscovery(MemoryStore())
    await store.put_card(digest_of(data), data)
    first = router(store, tmp_path / "cards")
    first.observe_worker(rec("w1", data, source="memory"))
    await eventually(lambda: first.tokenizer_for("tiny", quiet=True) is not None, within=20)
    folder = tmp_path / "cards" / digest_of(data).split(":", 1)[1]
    inode = folder.stat().st_ino
    second = ModelCards(store, tmp_path / "cards")
    await asyncio.to_thread(second._write, folder, ModelCard.from_bytes(data), data)
    assert folder.stat().st_ino == inode and (folder / "files" / "chat_template.jinja").is_file()
    (folder / "card.json").write_bytes(b"{}")  # a damaged folder is replaced
    await asyncio.to_thread(second._write, folder, ModelCard.from_bytes(data), data)
    assert (folder / "card.json").read_bytes() == data
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]

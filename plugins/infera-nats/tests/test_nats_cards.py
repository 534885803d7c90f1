"""Model cards on the NATS plane: the JetStream object store against a real nats-server."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from infera_core.config.backends import BackendOptions
from infera_core.discovery.base import CardStore, DiscoverySettings
from infera_core.plugin.hooks import InferaHooks
from infera_core.request import RequestContext
from infera_core.testing.server import until
from infera_core.testing.tiny_tokenizer import make_tiny_model_dir
from infera_core.tokenize.card import ModelCard, card_files, digest_of
from infera_core.tokenize.cards import ModelCards
from infera_core.tokenize.hf import HfTokenizer
from infera_core.tokenize.service import RoutingTokenizers
from infera_core.util.nats_server import NatsServer
from infera_core.worker import ModelCardRef, WorkerRecord

nats_discovery = pytest.importorskip("infera_nats.discovery")
NatsSettings = pytest.importorskip("infera_nats.settings").NatsSettings


def rec(worker_id: str, data: bytes) -> WorkerRecord:
    return WorkerRecord(
        worker_id=worker_id,
        url=f"http://127.0.0.1:9/{worker_id}",
        model="tiny",
        engine="vllm",
        model_card=ModelCardRef(digest=digest_of(data), size=len(data), source="nats"),
    )


async def started(server: NatsServer) -> CardStore:
    d = nats_discovery.NatsDiscovery(
        DiscoverySettings(
            options=BackendOptions(given=[NatsSettings(nats_url=server.url)]),
            lease_ttl=2.0,
            connect_timeout=3.0,
        )
    )
    await d.start()
    assert isinstance(d, CardStore)
    return d


async def test_nats_card_is_stored_fetched_verified_and_released(
    nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tiny = make_tiny_model_dir(tmp_path / "tiny", vocab=300, sentences=300)
    data = ModelCard(model="tiny", files=card_files(tiny), served_names=["tiny"]).to_bytes()
    digest = digest_of(data)
    disc = await started(nats_server)
    try:
        reg = await disc.register(rec("w1", data))  # type: ignore[attr-defined]
        await disc.put_card(digest, data)
        assert await disc.get_card(digest, len(data)) == data
        with pytest.raises(ValueError, match="over the limit"):
            await disc.get_card(digest, len(data) - 1)
        tokens = RoutingTokenizers(
            InferaHooks.load().catalog().tokenizers, cards=ModelCards(disc, tmp_path / "c")
        )
        tokens.observe_worker(rec("w1", data))
        await until(lambda: tokens.tokenizer_for("tiny", quiet=True) is not None, 20)
        ctx = RequestContext("r", "tiny", "/v1/completions", {"prompt": "the a of to"})
        await tokens.fill(ctx)
        assert ctx.token_ids == HfTokenizer(tiny).encode("the a of to")
        # a card stored under another digest is refused
        other = data.replace(b'"model":"tiny"', b'"model":"tinz"')
        await disc.put_card(digest_of(other), data)
        bad = rec("w2", other).model_copy(update={"model": "tinz"})
        with caplog.at_level(logging.ERROR):
            tokens.observe_worker(bad)
            await until(lambda: "failed" in (tokens.card_info("w2") or {}).get("status", ""), 20)
        assert "digest mismatch" in caplog.text
        await disc.release_card(digest)  # w1 still names it
        assert await disc.get_card(digest, len(data)) == data
        await reg.deregister()
        await disc.release_card(digest)
        assert await disc.get_card(digest, len(data)) is None
    finally:
        await disc.close()  # type: ignore[attr-defined]

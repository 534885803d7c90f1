"""SGLang DP-attention on the mixed (non-PD) path, end to end.

One sim acts as an SGLang ``--dp-size 2 --enable-dp-attention`` server (one URL, two ranks, each
with its own KV cache publishing on port + rank, as SGLang does); a second, plain sim competes.
Through the real router over HTTP with ``kv-aware`` routing, a prompt whose prefix is cached on
rank 1 must land on the DP server **and** carry ``X-Data-Parallel-Rank: 1`` (the sim serves a
request on the rank that header names, round robin without it, and counts per rank).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from infera_core.kv.component import KvRouting
from infera_core.kv.events import BlockStored, KvEventBatch
from infera_core.kv.index import KvIndex
from infera_core.kv.settings import KvSettings
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for
from infera_core.worker import KvEventsInfo, WorkerRecord

sim_testing = pytest.importorskip("infera_sim.testing")

BS = 16
MODEL = "sim-model"
FINGERPRINT = "infera-sim-v1:vocab=32000"


def _dp_record(sim: Any) -> WorkerRecord:
    """The record the SGLang adapter registers for a DP-attention server (``port_per_dp_rank``)."""
    return WorkerRecord(
        worker_id="dp",
        url=sim.url,
        model=MODEL,
        engine="sglang",
        dp_size=2,
        kv_events=KvEventsInfo(
            endpoint=sim.kv_events_endpoint,
            replay_endpoint=sim.replay_endpoint,
            format="sglang",
            block_size=BS,
            fingerprint=FINGERPRINT,
            port_per_dp_rank=True,
        ),
    )


@pytest.fixture
def sims() -> Iterator[tuple[Any, Any]]:
    with ExitStack() as stack:
        dp = stack.enter_context(sim_testing.start_sim(block_size=BS, dp_size=2, speedup="inf"))
        plain = stack.enter_context(sim_testing.start_sim(block_size=BS, speedup="inf"))
        yield dp, plain


def _prompt(topic: str, n: int = 300) -> str:
    return " ".join(f"{topic}{i % 97}" for i in range(n))


async def _rank_blocks(client: httpx.AsyncClient, url: str) -> dict[int | None, int]:
    view = (await client.get(url + "/v1/admin/cache-view/dp")).json()
    return {v["dp_rank"]: int(v["blocks"]) for v in view["views"]}


async def _wait_rank_blocks(client: httpx.AsyncClient, url: str, min_blocks: int) -> dict[int | None, int]:
    """The router's per-rank view sizes once both ranks' events arrived (the hub follows ports p, p + 1)."""
    deadline = time.monotonic() + 15.0
    while True:
        blocks = await _rank_blocks(client, url)
        if min(blocks.get(0, 0), blocks.get(1, 0)) >= min_blocks or time.monotonic() > deadline:
            return blocks
        await asyncio.sleep(0.02)


async def _dp_requests(client: httpx.AsyncClient, sim: Any) -> list[int]:
    return list((await client.get(sim.url + "/sim/info")).json()["dp_requests"])


async def test_prefix_cached_on_rank_1_routes_there_with_the_rank_header(sims: tuple[Any, Any]) -> None:
    dp, plain = sims
    hooks = make_hooks()
    async with serving(
        settings_for(router_policy="kv-aware"), hooks, kv=KvRouting(hooks.catalog(), KvSettings())
    ) as srv:
        srv.store.put(_dp_record(dp))
        srv.store.put(plain.record("plain"))
        await srv.wait_workers(2)
        async with httpx.AsyncClient(timeout=20) as client:
            # warm rank 1 of the DP server with one prefix and rank 0 with another, straight at the engine
            for rank, topic in ((1, "alpha"), (0, "beta")):
                body = {"model": MODEL, "prompt": _prompt(topic), "max_tokens": 1}
                r = await client.post(
                    dp.url + "/v1/completions", json=body, headers={"X-Data-Parallel-Rank": str(rank)}
                )
                assert r.status_code == 200, r.text
            assert await _dp_requests(client, dp) == [1, 1]
            blocks = await _wait_rank_blocks(client, srv.url, min_blocks=10)
            assert blocks.get(1, 0) >= 10 and blocks.get(0, 0) >= 10, blocks  # one view per rank

            for i in range(3):  # the rank-1 prefix, new suffixes: DP server, rank 1, every time
                body = {"model": MODEL, "prompt": _prompt("alpha") + f" question {i}", "max_tokens": 2}
                r = await client.post(srv.url + "/v1/completions", json=body)
                assert r.status_code == 200, r.text
            assert await _dp_requests(client, dp) == [1, 4]
            body = {"model": MODEL, "prompt": _prompt("beta") + " question", "max_tokens": 2}
            assert (await client.post(srv.url + "/v1/completions", json=body)).status_code == 200
            assert await _dp_requests(client, dp) == [2, 4]  # the rank-0 prefix: rank 0
            assert (await client.get(plain.url + "/sim/info")).json()["dp_requests"] == [0]


def _prefix_on_rank_1(worker_id: str) -> tuple[KvIndex, list[int]]:
    """A KV index mirroring a two-rank DP server ``worker_id`` whose rank 1 holds the 4 blocks
    of 16 of the returned 64 tokens."""
    index = KvIndex()
    tokens = list(range(1, 65))
    for rank in range(2):
        index.add_view(worker_id, rank, BS)
    rank1 = index.view(worker_id, 1)
    assert rank1 is not None
    stored = BlockStored(block_hashes=[1, 2, 3, 4], parent_block_hash=None, token_ids=tokens, block_size=BS)
    index.apply(rank1, KvEventBatch(ts=0.0, events=[stored], dp_rank=1))
    return index, tokens


@pytest.mark.parametrize("others", [1, 60])  # 61 candidates: the scorer's array path (score_rows)
def test_kv_overlap_credits_a_dp_server_with_its_best_rank(others: int) -> None:
    from infera_policies.kv import KvOverlapScorer

    from infera_core.request import RequestContext
    from infera_core.scheduling.arrays import ARRAY_MIN
    from infera_core.scheduling.dp import DpRanks
    from infera_core.scheduling.types import Endpoint

    index, tokens = _prefix_on_rank_1("dp")
    dp = Endpoint(WorkerRecord(worker_id="dp", url="http://x", model=MODEL, engine="sglang", dp_size=2))
    plain = [
        Endpoint(WorkerRecord(worker_id=f"w{i}", url="http://y", model=MODEL, engine="sim"))
        for i in range(others)
    ]
    for ep in plain:
        index.add_view(ep.worker_id, None, BS)
    candidates = [*plain, dp]
    ctx = RequestContext("r", MODEL, "/v1/completions", {}, token_ids=[*tokens, 5, 6, 7])
    scorer = KvOverlapScorer(index)
    scores = (
        scorer.score_rows(ctx, candidates) if len(candidates) >= ARRAY_MIN else scorer.score(ctx, candidates)
    )
    assert float(scores[-1]) == 1.0  # all 4 of the prompt's full blocks, on rank 1
    assert all(float(s) == 0.0 for s in scores[:-1])
    ranks = DpRanks(index)
    assert [ranks.choose(dp, ctx) for _ in range(3)] == [1, 1, 1]
    cold = RequestContext("r", MODEL, "/v1/completions", {}, token_ids=list(range(500, 600)))
    assert sorted(ranks.choose(dp, cold) or 0 for _ in range(4)) == [0, 0, 1, 1]  # nothing cached: in turn
    assert ranks.choose(plain[0], ctx) is None


def test_sim_adapter_launches_a_dp_attention_sim_as_sglang_registers_one() -> None:
    from infera_sim.adapter import SimAdapter

    from infera_core.engines.base import LaunchContext
    from infera_core.launcher.address import free_port
    from infera_core.worker import Role

    ctx = LaunchContext(
        worker_id="dp",
        model=MODEL,
        model_path=MODEL,
        role=Role.MIXED,
        host="127.0.0.1",
        port=free_port(),
        advertise_host="127.0.0.1",
        options={"block_size": BS, "dp_size": 2},
        free_port=free_port,
    )
    adapter = SimAdapter()
    argv = adapter.build_launch(ctx).argv
    assert argv[argv.index("--dp-size") + 1] == "2"
    fields = adapter.record_fields(ctx)
    kv = fields.kv_events
    assert kv is not None and kv.port_per_dp_rank and fields.dp_size == 2 and fields.dp_rank is None
    port = int(argv[argv.index("--kv-events-port") + 1])
    assert kv.endpoint == f"tcp://127.0.0.1:{port}"  # rank r on port + r (reserved as a consecutive pair)


def test_pd_decode_rank_follows_the_decode_rank_holding_the_prefix() -> None:
    """SGLang decode workers keep a radix cache (and publish KV events): the decode leg's
    X-Data-Parallel-Rank goes to the decode rank that holds the prompt's prefix."""
    from infera_core.request import RequestContext
    from infera_core.scheduling.pd import build_pd_scheduler
    from infera_core.scheduling.types import SchedulerDeps
    from infera_core.server.fleet import EndpointTable
    from infera_core.worker import PdInfo, Role

    index, tokens = _prefix_on_rank_1("d")
    table = EndpointTable()
    pd = PdInfo(protocol="sglang-bootstrap", params={"bootstrap_port": 8998})
    table.put(
        WorkerRecord(worker_id="p", url="http://p", model=MODEL, engine="sglang", role=Role.PREFILL, pd=pd)
    )
    table.put(
        WorkerRecord(
            worker_id="d", url="http://d", model=MODEL, engine="sglang", role=Role.DECODE, pd=pd, dp_size=2
        )
    )
    catalog = make_hooks().catalog()
    sched, _ = build_pd_scheduler(
        table, None, catalog.policies, SchedulerDeps(kv_index=index), catalog.pd_transports
    )
    for _ in range(3):
        c = RequestContext("r", MODEL, "/v1/completions", {}, token_ids=[*tokens, 7, 8])
        assert sched.pick_pair(c).decode_rank == 1
    cold = RequestContext("r", MODEL, "/v1/completions", {}, token_ids=list(range(500, 600)))
    assert sorted(sched.pick_pair(cold).decode_rank or 0 for _ in range(4)) == [0, 0, 1, 1]

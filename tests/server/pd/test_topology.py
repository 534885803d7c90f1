"""Topology and pairing: automatic PD vs mixed, never a mismatched pair, clear 503s, overrides, DP ranks."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from infera_core.engines.pd import check_pair
from infera_core.errors import ConfigError
from infera_core.request import RequestContext
from infera_core.scheduling.pd import PdScheduler, build_pd_scheduler
from infera_core.scheduling.scheduler import NoWorkerError
from infera_core.scheduling.types import SchedulerDeps
from infera_core.server.fleet import EndpointTable
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving_fleet, settings_for
from infera_core.testing.upstream import FakeUpstream, record_for
from infera_core.worker import PdInfo, Role, WorkerRecord

MODEL = "fake-model"
ENGINES = {"vllm": "vllm-nixl", "sglang": "sglang-bootstrap", "atom": "atom-mooncake"}
NIXL, SGLANG = PdInfo(protocol="vllm-nixl"), PdInfo(protocol="sglang-bootstrap")
SGLANG_AT_9 = PdInfo(protocol="sglang-bootstrap", params={"bootstrap_host": "127.0.0.1", "bootstrap_port": 9})


def rec(
    wid: str, role: Role, engine: str = "vllm", protocol: str | None = None, **extra: Any
) -> WorkerRecord:
    pd = None
    if role is not Role.MIXED:
        pd = PdInfo(protocol=protocol or ENGINES[engine], params={"bootstrap_port": 8998})
    return WorkerRecord(
        worker_id=wid, url=f"http://127.0.0.1:9/{wid}", model=MODEL, engine=engine, role=role, pd=pd, **extra
    )


def pd_scheduler(records: list[WorkerRecord], config: dict[str, Any] | None = None) -> PdScheduler:
    catalog = make_hooks().catalog()
    table = EndpointTable()
    for r in records:
        table.put(r)
    sched, _ = build_pd_scheduler(table, config, catalog.policies, SchedulerDeps(), catalog.pd_transports)
    return sched


def ctx() -> RequestContext:
    return RequestContext("r1", MODEL, "/v1/completions", {"model": MODEL, "prompt": "hi"})


def test_prefill_and_decode_of_one_engine_are_served_by_pairs() -> None:
    sched = pd_scheduler([rec("p", Role.PREFILL), rec("d", Role.DECODE), rec("m", Role.MIXED)])
    assert sched.topology(MODEL).pd and sched.topology(MODEL).error is None
    pair = sched.pick_pair(ctx())
    assert (pair.prefill.worker_id, pair.decode.worker_id) == ("p", "d")


def test_mismatched_engines_never_pair_and_mixed_workers_serve_instead() -> None:
    records = [rec("p-vllm", Role.PREFILL, "vllm"), rec("d-sglang", Role.DECODE, "sglang")]
    alone = pd_scheduler(records).topology(MODEL)
    assert alone.error is not None
    assert "p-vllm runs vllm but decode d-sglang runs sglang" in alone.error
    with_mixed = pd_scheduler([*records, rec("m", Role.MIXED)]).topology(MODEL)
    assert not with_mixed.pd and with_mixed.error is None
    with pytest.raises(NoWorkerError):
        pd_scheduler(records).pick_pair(ctx())


def test_same_engine_different_protocol_never_pairs() -> None:
    records = [rec("p", Role.PREFILL, "vllm", "vllm-nixl"), rec("d", Role.DECODE, "vllm", "vllm-mooncake")]
    topo = pd_scheduler(records).topology(MODEL)
    assert topo.error is not None and "vllm-nixl" in topo.error and "vllm-mooncake" in topo.error


@pytest.mark.parametrize("seed", range(5))
def test_random_mixed_engine_fleets_only_ever_form_compatible_pairs(seed: int) -> None:
    rng = random.Random(seed)
    records = [
        rec(f"w{i}", rng.choice([Role.PREFILL, Role.DECODE]), rng.choice(list(ENGINES))) for i in range(12)
    ]
    sched = pd_scheduler(records)
    if not sched.topology(MODEL).pd or sched.topology(MODEL).error:
        return
    seen = set()
    for _ in range(60):
        pair = sched.pick_pair(ctx())
        check_pair(pair.prefill.record, pair.decode.record)  # raises on a mismatch
        seen.add(pair.prefill.record.engine)
    assert seen


def test_only_one_side_answers_a_clear_message() -> None:
    only_prefill = pd_scheduler([rec("p1", Role.PREFILL), rec("p2", Role.PREFILL)]).topology(MODEL)
    assert only_prefill.error is not None
    assert "no decode worker is active (prefill workers: p1, p2)" in only_prefill.error
    only_decode = pd_scheduler([rec("d1", Role.DECODE)]).topology(MODEL)
    assert only_decode.error is not None and "no prefill worker is active" in only_decode.error
    served = pd_scheduler([rec("d1", Role.DECODE), rec("m", Role.MIXED)]).topology(MODEL)
    assert not served.pd and served.error is None


def test_per_model_override_forces_mixed_or_pd() -> None:
    fleet = [rec("p", Role.PREFILL), rec("d", Role.DECODE), rec("m", Role.MIXED)]
    forced_mixed = pd_scheduler(fleet, {"models": {MODEL: {"mode": "mixed"}}}).topology(MODEL)
    assert not forced_mixed.pd and forced_mixed.error is None
    forced_pd = pd_scheduler([rec("m", Role.MIXED)], {"mode": "pd"}).topology(MODEL)
    assert forced_pd.error is not None and "set to PD" in forced_pd.error


def test_bad_pd_config_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"pd\.mode"):
        pd_scheduler([], {"mode": "sometimes"})
    with pytest.raises(ConfigError, match=r"pd\.prefill.*no-such-preset"):
        pd_scheduler([], {"prefill": {"preset": "no-such-preset"}})


def test_draining_decode_is_not_paired() -> None:
    sched = pd_scheduler(
        [rec("p", Role.PREFILL), rec("d1", Role.DECODE, status="draining"), rec("d2", Role.DECODE)]
    )
    assert {sched.pick_pair(ctx()).decode.worker_id for _ in range(6)} == {"d2"}


def test_dp_attention_prefill_gets_every_rank_in_turn() -> None:
    sched = pd_scheduler([rec("p", Role.PREFILL, "sglang", dp_size=4), rec("d", Role.DECODE, "sglang")])
    ranks = [sched.pick_pair(ctx()).prefill_rank for _ in range(8)]
    assert None not in ranks
    assert sorted(r for r in ranks if r is not None) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_dp_rank_follows_the_rank_holding_the_prompt_prefix() -> None:
    from infera_core.kv.events import BlockStored, KvEventBatch
    from infera_core.kv.index import KvIndex

    index = KvIndex()
    tokens = list(range(1, 65))  # 4 blocks of 16
    for rank in range(4):
        index.add_view("p", rank, 16)
    stored = BlockStored(
        block_hashes=[101, 102, 103, 104], parent_block_hash=None, token_ids=tokens, block_size=16
    )
    view = index.view("p", 2)
    assert view is not None
    index.apply(view, KvEventBatch(ts=0.0, events=[stored], dp_rank=2))
    catalog = make_hooks().catalog()
    table = EndpointTable()
    table.put(rec("p", Role.PREFILL, "sglang", dp_size=4))
    table.put(rec("d", Role.DECODE, "sglang"))
    sched, _ = build_pd_scheduler(
        table, None, catalog.policies, SchedulerDeps(kv_index=index), catalog.pd_transports
    )
    for _ in range(3):
        c = RequestContext("r", MODEL, "/v1/completions", {}, token_ids=[*tokens, 7, 8, 9])
        assert sched.pick_pair(c).prefill_rank == 2
    cold = RequestContext("r", MODEL, "/v1/completions", {}, token_ids=list(range(500, 600)))
    cold_ranks = [sched.pick_pair(cold).prefill_rank for _ in range(4)]
    assert sorted(r for r in cold_ranks if r is not None) == [0, 1, 2, 3]  # no cached prefix: in turn


# -- over HTTP ---------------------------------------------------------------------------------


def fake(up: FakeUpstream, **fields: Any) -> WorkerRecord:
    record: WorkerRecord = record_for(up)
    return WorkerRecord.model_validate({**record.model_dump(), **fields})


def pd_pair(
    ups: dict[str, FakeUpstream],
    prefill: tuple[str, PdInfo],
    decode: tuple[str, PdInfo],
    **prefill_fields: Any,
) -> tuple[WorkerRecord, WorkerRecord]:
    """Upstream ``p`` as a prefill worker and ``d`` as a decode worker, each an (engine, PdInfo)."""
    p = fake(ups["p"], engine=prefill[0], role="prefill", pd=prefill[1], **prefill_fields)
    return p, fake(ups["d"], engine=decode[0], role="decode", pd=decode[1])


@pytest.fixture
async def ups() -> AsyncIterator[dict[str, FakeUpstream]]:
    out = {name: FakeUpstream(name) for name in ("p", "d", "m")}
    for u in out.values():
        await u.start()
    yield out
    for u in out.values():
        await u.stop()


async def test_mismatched_fleet_answers_503_then_mixed_worker_serves(ups: dict[str, FakeUpstream]) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with serving_fleet(*pd_pair(ups, ("vllm", NIXL), ("sglang", SGLANG))) as (srv, c):
        r = await c.post("/v1/chat/completions", json=body)
        assert r.status_code == 503
        err = r.json()["error"]
        assert (
            err["code"] == "no_pd_pair" and "prefill p runs vllm but decode d runs sglang" in err["message"]
        )
        assert ups["p"].requests == 0 and ups["d"].requests == 0
        await srv.add_workers(record_for(ups["m"]))
        r = await c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.json()["worker"] == "m"
        assert ups["p"].requests == 0 and ups["d"].requests == 0


async def test_router_config_file_forces_mixed(ups: dict[str, FakeUpstream], tmp_path: Path) -> None:
    cfg = tmp_path / "router.yaml"
    cfg.write_text(f"preset: round-robin\npd:\n  models:\n    {MODEL}: {{mode: mixed}}\n")
    body = {"model": MODEL, "prompt": "hi"}
    p, d = pd_pair(ups, ("sglang", SGLANG), ("sglang", SGLANG))
    async with serving_fleet(p, d, record_for(ups["m"]), settings=settings_for(router_config=cfg)) as (_, c):
        r = await c.post("/v1/completions", json=body)
        assert r.status_code == 200 and r.json()["worker"] == "m"
        assert ups["p"].requests == 0


async def test_sglang_bootstrap_room_steers_the_dp_rank(ups: dict[str, FakeUpstream]) -> None:
    body = {"model": MODEL, "prompt": "hi"}
    async with serving_fleet(*pd_pair(ups, ("sglang", SGLANG_AT_9), ("sglang", SGLANG), dp_size=4)) as (_, c):
        rooms = []
        for _ in range(4):
            r = await c.post("/v1/completions", json=body)
            assert r.status_code == 200 and r.json()["worker"] == "d"
            sent = json.loads(ups["p"].last_body)
            assert sent["bootstrap_port"] == 9 and sent["bootstrap_host"] == "127.0.0.1"
            assert json.loads(ups["d"].last_body)["bootstrap_room"] == sent["bootstrap_room"]
            rooms.append(sent["bootstrap_room"] % 4)
        assert sorted(rooms) == [0, 1, 2, 3]


async def test_anthropic_messages_go_through_a_pair(ups: dict[str, FakeUpstream]) -> None:
    body = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    async with serving_fleet(*pd_pair(ups, ("sglang", SGLANG_AT_9), ("sglang", SGLANG))) as (_, c):
        r = await c.post("/v1/messages", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["type"] == "message"
        sent = json.loads(ups["p"].last_body)
        assert ups["p"].last_path == ups["d"].last_path == "/v1/chat/completions"
        assert sent["bootstrap_room"] == json.loads(ups["d"].last_body)["bootstrap_room"]


async def test_serial_prefill_without_transfer_params_is_a_clear_502(ups: dict[str, FakeUpstream]) -> None:
    body = {"model": MODEL, "prompt": "hi"}
    async with serving_fleet(*pd_pair(ups, ("vllm", NIXL), ("vllm", NIXL))) as (_, c):
        r = await c.post("/v1/completions", json=body)
        assert r.status_code == 502
        assert "returned no kv_transfer_params" in r.json()["error"]["message"]
        assert ups["d"].requests == 0  # decode never saw a request it could not serve
        sent = json.loads(ups["p"].last_body)
        assert sent["max_tokens"] == 1 and sent["kv_transfer_params"]["do_remote_decode"] is True
        text = (await c.get("/metrics")).text
        assert 'infera_pd_failures_total{reason="prefill_no_transfer_params"} 1.0' in text

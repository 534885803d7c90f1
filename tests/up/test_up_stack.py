"""The ``Stack`` library (what ``up``, ``bench --policies`` and ``up --demo`` use)."""

from __future__ import annotations

import httpx
import psutil
import pytest
from rich.console import Console

from infera_core.up.demo import DemoWorkload, run_demo
from infera_core.up.settings import UpSettings
from infera_core.up.stack import Stack

pytest.importorskip("infera_sim")
pytest.importorskip("infera_policies")


@pytest.mark.slow
async def test_demo_kv_aware_beats_round_robin_and_stack_stops_clean() -> None:
    settings = UpSettings(workers=4, policy="kv-aware", port=0, quiet=True, drain_timeout=2)
    engine_args = ["--speedup", "20", "--cache-blocks", "2048"]
    async with Stack(settings, engine_args=engine_args) as stack:
        pids = stack.engine_pids()
        assert len(pids) == 4
        async with httpx.AsyncClient() as client:
            health = (await client.get(f"{stack.root}/health")).json()
        assert health["active_workers"] == 4
        w = DemoWorkload(groups=6, questions_per_group=5, prefix_len=400, question_len=12, output_len=4)
        rr, routed = await run_demo(stack, Console(quiet=True), w)
    assert rr.summary["completed"] == routed.summary["completed"] == 30
    rr_hit = rr.summary["prefix_cache_hit_rate"]
    kv_hit = routed.summary["prefix_cache_hit_rate"]
    # round-robin pays each prefix once per worker; kv-aware about once per group
    assert kv_hit > rr_hit + 0.15, (rr_hit, kv_hit)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)

"""``infera-run bench`` against a router with API keys and an admin token: requests carry
the key, the router's /metrics and /v1/workers are read with the admin token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from infera_core.bench.config import BenchSettings
from infera_core.bench.plan import run_config
from infera_core.bench.runner import BenchError, run_bench
from infera_core.bench.workloads import shared_prefix_workload
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for
from infera_core.worker import WorkerRecord

pytest.importorskip("infera_sim")
from infera_sim.testing import SimHandle, start_sim

MODEL = "sim-model"
ADMIN = "admin-tok"


@pytest.fixture
def sim() -> Iterator[SimHandle]:
    with start_sim(model=MODEL, speedup="inf", kv_events_port=None, kv_replay_port=None) as s:
        yield s


@pytest.mark.parametrize("with_tokens", [True, False])
async def test_bench_sends_the_api_key_and_reads_router_metrics_with_the_admin_token(
    sim: SimHandle, tmp_path: Path, with_tokens: bool
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"name": "bench", "key": "sk-bench", "models": [MODEL]}]}))
    sessions = shared_prefix_workload(2, 32, 2, 8, 4, seed=1)
    async with serving(settings_for(api_key_file=keys, admin_token=ADMIN), make_hooks()) as srv:
        srv.store.put(WorkerRecord(worker_id="sim0", url=sim.url, model=MODEL, engine="sim"))
        await srv.wait_workers(1)
        if not with_tokens:
            with pytest.raises(BenchError, match=r"answered 401.*pass --api-key"):
                await run_bench(sessions, run_config(BenchSettings(quiet=True), srv.url + "/v1"))
            return
        settings = BenchSettings(quiet=True, concurrency=2, api_key="sk-bench", admin_token=ADMIN)
        result = await run_bench(sessions, run_config(settings, srv.url + "/v1"))
    assert all(r.ok for r in result.results), [r.error for r in result.results]
    # the router's /metrics (routing-decision latency) and /v1/workers (so the worker's cache
    # hit rate) were readable: without the admin token both are missing
    assert any(name.startswith("infera_routing_decision") for name in result.router), result.router
    assert result.summary.get("prefix_cache_hit_rate") is not None

"""ATOM drain: the adapter reads ATOM's in-flight gauges, so a draining worker stops as soon as
ATOM reports 0 instead of waiting the whole ``--drain-timeout``.

The gauge names and exposition are ATOM's (``atom/entrypoints/openai/metrics.py`` on ROCm/ATOM
main: ``atom:requests_running`` / ``atom:requests_waiting`` / ``atom:requests_parked_kv_load``,
summed across DP ranks, and ``atom:metrics_snapshot_available``). The drain test runs a real
launcher (memory discovery) over a stand-in ATOM server that serves those gauges.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
from infera_atom.adapter import AtomAdapter, atom_in_flight

from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.engines.base import (
    EngineOption,
    EngineRegistry,
    LaunchContext,
    LaunchSpec,
    RecordFields,
    RunningEngine,
)
from infera_core.engines.settings import WorkerSettings
from infera_core.engines.support import AdapterBase
from infera_core.launcher.runtime import WorkerLauncher
from infera_core.plugin.spec import hookimpl
from infera_core.testing.fixtures import make_hooks

STANDIN = Path(__file__).with_name("atom_standin.py")
ATOM_TEXT = """# HELP atom:metrics_snapshot_available Whether an engine snapshot is available.
# TYPE atom:metrics_snapshot_available gauge
atom:metrics_snapshot_available 1.0
# HELP atom:requests_running Number of requests currently running across data-parallel ranks.
# TYPE atom:requests_running gauge
atom:requests_running 3.0
# HELP atom:requests_waiting Number of requests waiting across data-parallel ranks.
# TYPE atom:requests_waiting gauge
atom:requests_waiting 2.0
# HELP atom:requests_parked_kv_load Number of requests parked for an external KV load.
# TYPE atom:requests_parked_kv_load gauge
atom:requests_parked_kv_load 1.0
# HELP atom:requests_finished_total Requests completed by the scheduler.
# TYPE atom:requests_finished_total counter
atom:requests_finished_total 40.0
"""


def test_in_flight_is_running_plus_waiting_plus_parked() -> None:
    assert atom_in_flight(ATOM_TEXT) == 6


def test_without_a_snapshot_or_the_gauges_in_flight_is_unknown() -> None:
    assert atom_in_flight(ATOM_TEXT.replace("available 1.0", "available 0.0")) is None
    assert atom_in_flight("# nothing here\nvllm:num_requests_running 0.0\n") is None
    # an ATOM without the snapshot gauge (older exporters) still counts
    older = "\n".join(line for line in ATOM_TEXT.splitlines() if "snapshot" not in line)
    assert atom_in_flight(older) == 6


class _AtomStandin(AdapterBase):
    """Runs the stand-in ATOM server; ``in_flight`` is the real ATOM adapter's."""

    name = "atom-standin"
    description = "a stand-in ATOM server (tests)"
    package_hint = "-"
    engine_options = (EngineOption("busy", int, 0, "Requests in flight at start."),)

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        busy = str(ctx.options.get("busy") or 0)
        argv = [sys.executable, str(STANDIN), "--host", ctx.host, "--port", str(ctx.port), "--busy", busy]
        return LaunchSpec(argv=argv, env={"PYTHONUNBUFFERED": "1"})

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        return RecordFields()

    async def in_flight(self, engine: RunningEngine) -> int | None:
        return await AtomAdapter().in_flight(engine)


class _Plugin:
    @hookimpl
    def infera_register_engines(self, registry: EngineRegistry) -> None:
        registry.add(_AtomStandin())


async def test_drain_ends_as_soon_as_atom_reports_zero() -> None:
    drain_timeout = 60.0
    launcher = WorkerLauncher(
        make_hooks(("atom-standin", _Plugin())),
        "atom-standin",
        WorkerSettings(model="m", worker_id="atom-drain", drain_timeout=drain_timeout),
        options={"busy": 3},
        discovery=MemoryDiscovery(MemoryStore()),
        echo=lambda line: None,
    )
    task = asyncio.create_task(launcher.run())
    record = await launcher.wait_registered(within=60)
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{record.url}/scrapes")).text == "0"  # nothing read it before the drain
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await launcher.stop()
    assert await task == 0
    elapsed = loop.time() - t0
    # 3 requests in flight, one finishing per scrape: the drain read 3, 2, 1, 0 and stopped then
    assert elapsed < drain_timeout / 2, f"drain took {elapsed:.1f}s: the ATOM gauges were not read"

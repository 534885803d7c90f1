"""Fixtures shared by the server tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, serving, settings_for
from infera_core.testing.upstream import FakeUpstream, fake_upstreams
from infera_core.worker import WorkerRecord

SIM_MODEL = "sim-model"


@pytest.fixture
async def ups() -> AsyncIterator[list[FakeUpstream]]:
    """Two fake upstreams; a test file that needs another number overrides this fixture."""
    async with fake_upstreams(2) as out:
        yield out


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Any]]:
    """Two sims of ``sim-model`` without KV events, for a test file (one that needs others
    overrides this fixture)."""
    sim_testing = pytest.importorskip("infera_sim.testing")
    with sim_testing.start_sims(
        2, model=SIM_MODEL, speedup="inf", kv_events_port=None, kv_replay_port=None
    ) as started:
        yield started


@pytest.fixture
async def srv(sims: list[Any]) -> AsyncIterator[RunningServer]:
    """A router (default settings) over :func:`sims`, once its table holds both."""
    async with serving(settings_for(), make_hooks()) as server:
        for i, s in enumerate(sims):
            server.store.put(WorkerRecord(worker_id=f"sim{i}", url=s.url, model=SIM_MODEL, engine="sim"))
        await server.wait_workers(len(sims))
        yield server


@pytest.fixture
async def oai(srv: RunningServer) -> AsyncIterator[openai.AsyncOpenAI]:
    """An OpenAI client of :func:`srv`, closed after the test (its pool's sockets with it)."""
    async with openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client

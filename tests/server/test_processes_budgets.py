"""API-key budgets under ``infera-run serve --processes 2``: one budget for the router.

Real processes (the supervisor and its two forks), real HTTP on 127.0.0.1 with a new
connection per request (``SO_REUSEPORT`` spreads connections over the processes), the
sim as the worker, a static fleet. Each test checks that both processes took some of
its requests, so a budget kept per process would let more through than asserted."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infera_core.server.reserve import reservation
from infera_core.testing.serve_processes import CLOSE, ServeProcesses, serve_processes
from infera_core.testing.serve_processes import poll as _until

sim_testing = pytest.importorskip("infera_sim.testing")

MODEL = "sim-model"
PROMPT = "the same prompt every time"
BODY = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2}
RESERVED = reservation(BODY, 4096)
"""What admission reserves for :data:`BODY`: a budget of exactly this admits it once, nothing
after it (its real cost is above 0)."""
KEYS: dict[str, Any] = {
    "keys": [
        {"name": "free", "key": "sk-free"},
        {"name": "rate", "key": "sk-rate", "requests_per_minute": 6},
        {"name": "day", "key": "sk-day", "tokens_per_day": RESERVED},
        {"name": "later", "key": "sk-later", "tokens_per_day": 1_000_000},
        {"name": "kept", "key": "sk-kept", "tokens_per_day": RESERVED},
    ]
}


class Router:
    def __init__(self, serve: ServeProcesses, keys: Path) -> None:
        self.serve = serve
        self.http = serve.http
        self.keys = keys

    def complete(self, key: str) -> httpx.Response:
        return self.http.post(
            "/v1/completions", json=BODY, headers={**CLOSE, "authorization": f"Bearer {key}"}
        )

    def usage(self, name: str) -> dict[str, Any]:
        """Key ``name`` in ``GET /v1/admin/usage`` (limits as the answering process has them)."""
        r = self.http.get("/v1/admin/usage", headers=CLOSE)
        assert r.status_code == 200, r.text
        (key,) = [k for k in r.json()["keys"] if k["key"] == name]
        return {**key, "process": r.headers["x-infera-process"]}

    def send_until_both_served(self, key: str, at_least: int) -> tuple[list[httpx.Response], float]:
        """``at_least`` requests with ``key``, then more until both processes took some of them."""
        before = self.serve.answered()
        t0 = time.monotonic()
        out: list[httpx.Response] = []
        while True:
            out.append(self.complete(key))
            if len(out) >= at_least:
                now = self.serve.answered()
                if all(now[p] > before[p] for p in before):
                    return out, time.monotonic() - t0
                assert len(out) < 200, (before, now)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    tmp = tmp_path_factory.mktemp("budgets")
    keys = tmp / "keys.yaml"
    keys.write_text(yaml.safe_dump(KEYS))
    with (
        sim_testing.start_sim(model=MODEL, speedup="inf", kv_events_port=None, kv_replay_port=None) as sim,
        serve_processes(
            [{"worker_id": "sim0", "url": sim.url, "model": MODEL}],
            tmp,
            "--router-policy",
            "round-robin",
            "--api-key-file",
            str(keys),
        ) as serve,
    ):
        r = Router(serve, keys)
        _until(lambda: r.complete("sk-free").status_code == 200)
        yield r


def test_requests_per_minute_is_one_bucket_for_the_router(router: Router) -> None:
    got, elapsed = router.send_until_both_served("sk-rate", at_least=12)
    ok = [r for r in got if r.status_code == 200]
    refused = [r for r in got if r.status_code != 200]
    # 6 from the full bucket, plus one per 10 s the sending took (none on any sane machine)
    assert 6 <= len(ok) <= 6 + int(elapsed / 10), (len(ok), elapsed)
    assert len(refused) == len(got) - len(ok) >= 6
    for r in refused:
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert 1 <= int(r.headers["retry-after"]) <= 10
    used = router.usage("rate")
    assert used["requests_per_minute"] == 6
    assert used["models_used"][MODEL]["requests"] == len(ok)


def test_tokens_per_day_is_one_budget_for_the_router(router: Router) -> None:
    first = router.complete("sk-day")
    assert first.status_code == 200, first.text
    spent = first.json()["usage"]["total_tokens"]
    assert spent > 1
    # the first request's tokens are counted once it ended; every process must then refuse
    _until(lambda: router.usage("day")["tokens_today"] == spent)
    got, _ = router.send_until_both_served("sk-day", at_least=10)
    assert [r.status_code for r in got] == [429] * len(got)
    assert {r.json()["error"]["code"] for r in got} == {"token_budget_exceeded"}
    assert all(int(r.headers["retry-after"]) >= 1 for r in got)
    used = router.usage("day")
    assert used["tokens_today"] == spent  # not summed over the processes
    assert used["models_used"][MODEL]["requests"] == 1
    row = used["models_used"][MODEL]
    assert row["prompt_tokens"] + row["completion_tokens"] == spent


def _spent(name: str, tokens: int, router: Router) -> Callable[[], bool]:
    def spent() -> bool:
        return bool(router.usage(name)["tokens_today"] == tokens)

    return spent


def test_a_changed_key_file_is_read_by_every_process(router: Router) -> None:
    probe = router.complete("sk-free")
    assert probe.status_code == 200
    cost = probe.json()["usage"]["total_tokens"]  # every request here costs the same
    budget = 2 * cost + RESERVED  # the 3rd request's reservation fits; the 4th's does not
    changed = copy.deepcopy(KEYS)
    changed["keys"][3]["tokens_per_day"] = budget
    router.keys.write_text(yaml.safe_dump(changed))

    def reloaded_everywhere() -> bool:
        router.complete("sk-free")  # a keyed request makes the process that gets it look at the file
        seen: dict[str, int] = {}
        for _ in range(50):  # new connections until each process answered with its own limits
            u = router.usage("later")
            seen[u["process"]] = u["tokens_per_day"]
            if len(seen) == 2:
                return all(v == budget for v in seen.values())
        return False

    _until(reloaded_everywhere)
    before = router.serve.answered()
    statuses: list[int] = []
    while len(statuses) < 10 or not all(router.serve.answered()[p] > before[p] for p in before):
        r = router.complete("sk-later")
        statuses.append(r.status_code)
        if r.status_code == 200:  # its tokens count before the next request
            _until(_spent("later", statuses.count(200) * cost, router))
        assert len(statuses) < 200
    assert statuses[:3] == [200, 200, 200]
    assert set(statuses[3:]) == {429}
    assert router.usage("later")["tokens_today"] == 3 * cost


def test_a_restarted_process_keeps_the_budgets(router: Router) -> None:
    first = router.complete("sk-kept")
    assert first.status_code == 200, first.text
    spent = first.json()["usage"]["total_tokens"]
    _until(_spent("kept", spent, router))
    router.serve.kill(router.serve.processes()[0])
    got, _ = router.send_until_both_served("sk-kept", at_least=6)
    assert {r.status_code for r in got} == {429}  # the new process found the day's tokens spent
    assert router.usage("kept")["tokens_today"] == spent
